"""The seam between the front ends and the index: a batch decided (``decide``), committed (``engine``), queried."""
