"""The private names of other libraries that the package needs, one module per library.

Each module wraps a few names that the library does not make public, with a docstring saying what is
wrapped, why no public name serves and which version was tested. The rest of the package imports them
from here, never from the library, and ``tests/unit/test_compat.py`` uses each one, so that a release that
moves or changes one fails a named test instead of a user's run. This is the lowest layer: it imports
nothing else of the package. The modules are imported one by one (``from mae.compat.torch import ...``),
so that using one library's names does not import the others.
"""
