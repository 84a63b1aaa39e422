"""eagle3: regenerate data, cache hidden states, train, evaluate and serve EAGLE-3 draft heads."""

from importlib.metadata import PackageNotFoundError, version

try:  # the version lives in pyproject.toml only
    __version__ = version("eagle3cli")
except PackageNotFoundError:  # a checkout used without `pip install`
    __version__ = "0+unknown"
