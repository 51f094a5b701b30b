"""The optional native scanner; everything else about the package is in pyproject.toml.

`optional=True`: where no C compiler is available the install still succeeds, and
tracediag.ingest.chrome decodes with msgspec alone, tracediag.ingest.flight its pickles with the
restricted unpickler alone (slower, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracediag.ingest._chromescan",
            ["tracediag/ingest/_chromescan.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "tracediag.ingest._frscan",
            ["tracediag/ingest/_frscan.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
    ]
)
