"""Build hook for probe's optional C extensions (metadata lives in pyproject.toml).

``probe.dump._cstats`` computes tensor statistics in one pass; ``probe.dump._cstack``
reads the key of a call stack; ``probe.compare.xlsx._cjoin`` joins the rows of the
compare's workbook and CSV; ``probe.compare.xlsx._cfloat`` (C++: std::to_chars) makes
the texts of their numbers; ``probe.compare._cflat`` makes the rows of a dump.json
entry. All are optional: where no C compiler is found the build
goes on without them and probe uses its Python paths, which give the same results.
"""
import sys

from setuptools import Extension, setup

# Let the compiler vectorise the reductions (reassociate sums); NaN and Inf semantics are
# kept (no -ffast-math / -ffinite-math-only).
_FLAGS = [] if sys.platform == "win32" else [
    "-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math"]

_CXX_FLAGS = ["/std:c++17"] if sys.platform == "win32" else ["-O3", "-std=c++17"]

setup(ext_modules=[Extension("probe.dump._cstats", ["probe/dump/_cstats.c"],
                             extra_compile_args=_FLAGS, optional=True),
                   Extension("probe.dump._cstack", ["probe/dump/_cstack.c"],
                             extra_compile_args=_FLAGS, optional=True),
                   Extension("probe.compare.xlsx._cjoin", ["probe/compare/xlsx/_cjoin.c"],
                             depends=["probe/compare/xlsx/_cfloat.h"], extra_compile_args=_FLAGS, optional=True),
                   Extension("probe.compare.xlsx._cfloat", ["probe/compare/xlsx/_cfloat.cpp"],
                             depends=["probe/compare/xlsx/_cfloat.h"], language="c++",
                             extra_compile_args=_CXX_FLAGS, optional=True),
                   Extension("probe.compare._cflat", ["probe/compare/_cflat.c"],
                             extra_compile_args=_FLAGS, optional=True)])
