"""Backend: a Hugging Face config.json, local or from the Hub."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from advisor.errors import BackendUnreachable, InputError
from advisor.hfconfig import from_config
from advisor.spec import ModelSpec

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFBackend:
    name = "hf"
    summary = "a Hugging Face config.json: a local file or folder, or a repo id fetched from the Hub"

    def load_spec(self, ref: str) -> ModelSpec:
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return from_config(_load_json(path), source=str(path))
        if ref.endswith(".json") or ref.startswith((".", "/", "~")):
            raise InputError(f"{ref}: no such file")
        if not _REPO_ID.match(ref):
            raise InputError(f"{ref!r} is neither a config.json file nor a Hub repo id like 'Qwen/Qwen3-8B'")
        return from_config(_load_json(_download(ref)), source=f"hf:{ref}")


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config.json must hold a JSON object")
    return data


def _download(repo_id: str) -> Path:
    """hf_hub_download honours HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE and the HF cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except GatedRepoError:
        raise InputError(
            f"{repo_id} is gated: accept its licence on the Hub, then give a token",
            hint="export HF_TOKEN=<your token> (or run `hf auth login`)",
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"{repo_id}: no such repository on the Hub (or it is private)",
            hint="check the name; for a private repo export HF_TOKEN",
        ) from None
    except EntryNotFoundError:
        raise InputError(f"{repo_id} has no config.json (a GGUF-only repo? use `kvadvise gguf`)") from None
    except LocalEntryNotFoundError:
        raise BackendUnreachable(
            f"{repo_id}: the Hub cannot be reached and config.json is not in the local cache",
            hint="connect to the network once, or pass a local config.json",
        ) from None
    except (OSError, HfHubHTTPError) as e:
        raise BackendUnreachable(f"{repo_id}: download failed ({type(e).__name__})") from None
