"""Type aliases of the public API's annotations (see ``[tool.mypy]`` in pyproject.toml)."""
import os
from typing import Union

#: A file-system path as the public API accepts it: ``str`` or an ``os.PathLike`` such as ``pathlib.Path``.
StrPath = Union[str, "os.PathLike[str]"]
