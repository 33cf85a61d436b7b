"""Builds the optional compiled kernel of signing (streamdedup/core/_kernel.c).

``optional=True``: when no C compiler or Python headers are there, the install
goes on without it and signing runs the numpy path, which gives the same hashes.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("streamdedup.core._kernel", ["streamdedup/core/_kernel.c"],
                             extra_compile_args=["-O3", "-std=c99"], optional=True)])
