"""Refresh ``profiles/ollama_library.json``: library tags read from Ollama's registry, for planning offline.

For each name it asks the registry as ``kvadvise ollama NAME`` does before a pull
(kvadvise.backends.ollama.registry: the manifest, the params blob, the model blob's and the projector's
GGUF headers by range reads, a few MB a tag) and keeps what was served, with the registry and the date:
kvadvise.backends.ollama.snapshots then plans such a tag offline from its real header. Nothing is typed by
hand; a name the registry does not have is reported and left out. Entries not named in a run are kept.

The names: the built-in profiles' tags and their aliases (profiles/ollama_models.json) and the names new
users typed (issue 41: mistral-small3.2, llama4:scout, magistral, granite4, qwen2.5vl, deepseek-r1:671b,
smollm2), or the names given. The registry is https://registry.ollama.ai, or KVADVISE_OLLAMA_REGISTRY
(a mirror); proxies as urllib reads them (https_proxy, no_proxy).

    python benchmarks/library_profiles.py                  # the default names, into profiles/ollama_library.json
    python benchmarks/library_profiles.py qwen3:8b gemma3  # these names only
    python benchmarks/library_profiles.py --out FILE ...   # somewhere else
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "profiles" / "ollama_library.json"
# tried by a new user and not found (issue 41, "Why"); the rest of the default list is the built-in profiles'
ASKED = ("mistral-small3.2", "llama4:scout", "magistral", "granite4", "qwen2.5vl", "deepseek-r1:671b", "smollm2")


def default_names() -> list[str]:
    from kvadvise.backends.ollama.profiles import profiles

    names = {key for key in profiles()}  # ids and aliases, lower case
    return sorted(names | set(ASKED))


def read_tag(ref: str) -> tuple[str, dict[str, Any] | None, str]:
    """``model:tag``, its entry (None when the registry does not have it) and a line for the summary."""
    from kvadvise.backends.gguf_cache import encode
    from kvadvise.backends.ollama import registry
    from kvadvise.backends.ollama.name import parse_name

    name = parse_name(ref)
    key = f"{name.model}:{name.tag}".lower()
    if not name.is_library:
        return key, None, f"{ref}: not a library name; skipped"
    base = registry.registry_url(name)
    if base is None:
        raise SystemExit(f"{registry.REGISTRY_ENV}=off: no registry to read")
    manifest = registry.fetch_manifest(name, base)
    if manifest is None:
        return key, None, f"{key}: not in the registry ({registry.manifest_url(base, name)}: 404)"
    params = registry.params_of(manifest)
    headers = registry.read_headers(manifest)
    layer = registry.model_layers(manifest)[-1]
    entry: dict[str, Any] = {
        "registry": base,
        "date": registry.today(),
        "manifest": manifest.text,
        "params": params,
        "header": encode(headers.model),
        "projector_header": encode(headers.projector) if headers.projector is not None else None,
    }
    arch = headers.model.metadata.get("general.architecture", "?")
    return key, entry, f"{key}: {arch}, {layer.size / 1e9:.2f} GB blob, {layer.digest[:19]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="library names (default: the built-in profiles' and ASKED)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the file to update (default: {OUT})")
    args = parser.parse_args(argv)

    from kvadvise.errors import KvadviseError

    doc: dict[str, Any] = {"format": 1, "models": {}}
    if args.out.exists():
        doc = json.loads(args.out.read_text(encoding="utf-8"))
    models: dict[str, Any] = dict(doc.get("models") or {})
    read = failed = 0
    for ref in args.names or default_names():
        try:
            key, entry, line = read_tag(ref)
        except KvadviseError as e:
            failed += 1
            print(f"{ref}: {e.message}", file=sys.stderr)
            continue
        print(line)
        if entry is not None:
            models[key] = entry
            read += 1
    doc["models"] = dict(sorted(models.items()))
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{read} tags read, {failed} failed; {len(models)} in {args.out}")
    return 0 if read or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
