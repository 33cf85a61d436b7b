"""Pure functions of the records: the nouns, decoding, normalizing, shingling, signing, banding, verifying.

Nothing here opens the index or talks to Kafka, so a preparing process imports this layer alone.
"""
