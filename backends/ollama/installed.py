"""``kvadvise ollama --installed``: every model of the local store (and of the server's ``/api/tags``,
matched by manifest digest), one line each, sized on this GPU under the server's current settings.

The store is read model by model (each manifest once, each header through the header cache), in
turn: a listing is mostly Python work, and threads only slowed it on 2 cores (1.70x on a warm 1,000-model
store, benchmarks/bench_list.py); the server is asked three things: ``/api/tags`` (what it lists), ``/api/ps`` (what it holds now) and,
for a model it lists that no store here has, ``/api/show``. The server's settings cannot be read over its
API: they are taken from this shell's ``OLLAMA_*`` variables, as the server would read them if started
here (``-np`` and ``-ctk`` override them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import store as ollama_store
from kvadvise.backends.ollama.name import OllamaName
from kvadvise.errors import BackendUnreachable, InputError, KvadviseError
from kvadvise.request import check

if TYPE_CHECKING:  # the listing module loads only with --installed: `kvadvise ollama NAME` starts without it
    from kvadvise.planner.inventory import RunSettings
    from kvadvise.ui.flags import Flags
    from kvadvise.ui.listing import Listed, Loaded

# a listing this long shows how far it is on a terminal's stderr
LONG_LISTING = 50


@dataclass(frozen=True, slots=True)
class Tagged:
    """One model of ``/api/tags``."""

    name: str
    digest: str  # sha256 hex of the manifest
    size: int


def store_names(root: Path) -> list[OllamaName]:
    """Every ``manifests/<host>/<namespace>/<model>/<tag>`` of a store, sorted (store.list_manifests)."""
    return list(ollama_store.list_manifests(root).names)


def _from_store(root: Path, name: OllamaName) -> Listed:
    from kvadvise.backends.ollama.resolve import from_store
    from kvadvise.ui.listing import Listed

    shown = name.display
    try:
        entry = ollama_store.find(name, [root])  # the manifest, read once
        if entry is None:  # removed while listing
            raise InputError(f"{shown}: its manifest is gone")
        m = from_store(name, entry)
    except KvadviseError as e:
        return Listed(name=shown, source=f"store:{root}", size_bytes=0, spec=None, error=e.message)
    from kvadvise.backends.ollama.rules import fit_target_raise_bytes, own_tower, projector_margin_bytes

    # a blob's own tower, passed as its --mmproj (kvadvise.backends.ollama.towers): its bytes are in the weights
    # listed here, so Ollama's raise of the fit target is what is left (its image's compute is not listed)
    tower = own_tower(m)
    raised = fit_target_raise_bytes(tower.file_bytes, planned=True) if tower is not None else 0
    return Listed(
        name=shown,
        source=m.source,
        size_bytes=entry.model_bytes + entry.projector_bytes,
        spec=m.spec,
        digest=m.digest,
        model_ctx=m.default_num_ctx,
        extra_margin_bytes=projector_margin_bytes(m) or raised,
        notes=m.notes,
    )


def read_store(roots: tuple[Path, ...], listed: dict[Path, ollama_store.Manifests] | None = None) -> list[Listed]:
    """Every model of every store root (a name in two roots: the first, as Ollama reads them), one after
    the other (a thread pool only slowed it on 2 cores); ``listed``: the stores' manifests when already
    listed."""
    from kvadvise.ui import output

    jobs: list[tuple[Path, OllamaName]] = []
    seen: set[str] = set()
    for root in roots:
        for name in listed[root].names if listed and root in listed else store_names(root):
            if name.full.lower() not in seen:
                seen.add(name.full.lower())
                jobs.append((root, name))
    out = []
    for done, (root, name) in enumerate(jobs, 1):
        out.append(_from_store(root, name))
        if len(jobs) >= LONG_LISTING:
            output.progress(done, len(jobs), "reading the model store")
    return out


def tags(url: str) -> tuple[Tagged, ...]:
    """``GET /api/tags``: the models the server lists. BackendUnreachable when none answers."""
    try:
        doc = ollama_api.call(url, "GET", "/api/tags")
    except ollama_api.ClientError as e:
        raise BackendUnreachable(
            f"Ollama at {url} refused /api/tags: HTTP {e.status_code} {ollama_api.one_line(e.error)}"
        ) from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if models is None and isinstance(doc, dict):
        models = []
    if not isinstance(models, list):
        raise BackendUnreachable(f"{url} answered /api/tags with an unexpected payload: no list of models")
    out = []
    for m in models:
        if not isinstance(m, dict):
            continue
        name = m.get("name") if isinstance(m.get("name"), str) else m.get("model")
        if not isinstance(name, str):
            continue
        digest = m.get("digest")
        size = m.get("size")
        digest = digest.removeprefix("sha256:") if isinstance(digest, str) else ""
        out.append(Tagged(name, digest, size if isinstance(size, int) and not isinstance(size, bool) else 0))
    return tuple(out)


def _from_server(url: str, t: Tagged) -> Listed:
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.ui.listing import Listed

    try:
        m = resolve(t.name, host=url, roots=(), use_registry=False, use_profiles=False)
    except KvadviseError as e:
        return Listed(name=t.name, source=f"api:{url}", size_bytes=t.size, spec=None, error=e.message, digest=t.digest)
    return Listed(
        name=m.ref,
        source=m.source,
        size_bytes=t.size,
        spec=m.spec,
        digest=t.digest or None,
        model_ctx=m.default_num_ctx,
        on_server=True,
        notes=m.notes,
    )


def _same(a: str, b: str) -> bool:
    def norm(s: str) -> str:
        return s if ":" in s.rpartition("/")[2] else s + ":latest"

    return norm(a).lower() == norm(b).lower()


@dataclass(frozen=True, slots=True)
class Server:
    """The Ollama server the listing asked: where, whether it answered, its version."""

    url: str
    reachable: bool = False
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Installed:
    """The models of the store and of the server, and what the listing could not see."""

    models: list[Listed]
    server: Server
    roots: tuple[Path, ...]
    notes: tuple[str, ...]


def installed(host: str | None) -> Installed:
    """The store's models and the server's, matched by digest, with what the server holds now."""
    roots = ollama_store.store_roots()
    manifests = {r: ollama_store.list_manifests(r) for r in roots}
    found = [r for r in roots if manifests[r].present]
    models = read_store(tuple(found), listed=manifests)
    url = ollama_api.server_url(host)
    notes = [ollama_store.skipped_note(r, d) for r in roots for d in manifests[r].skipped]
    try:
        listed = tags(url)
        running = ollama_api.running_models(url)
        version = ollama_api.server_version(url)
    except BackendUnreachable as e:
        if not found:
            shown = "; ".join([", ".join(str(r) for r in roots), *notes])
            raise BackendUnreachable(
                f"no Ollama model store here ({shown}) and no server answered: {e.message}",
                hint="start the server (`ollama serve`), set OLLAMA_HOST, or set OLLAMA_MODELS to the store",
            ) from None
        notes.append(f"{e.message}: the store alone is listed (no LOADED column)")
        return Installed(models, Server(url), tuple(found), tuple(notes))
    by_digest = {t.digest: t for t in listed if t.digest}
    out = []
    for m in models:
        on = m.digest is not None and m.digest in by_digest
        out.append(replace(m, on_server=on, loaded=_loaded(m, running)))
    known = {m.digest for m in models if m.digest}
    for t in listed:
        if t.digest and t.digest in known:
            continue
        m = _from_server(url, t)
        out.append(replace(m, loaded=_loaded(m, running)))
    if not found:
        notes.append("no model store on this machine: the server's models are listed (read through /api/show)")
    return Installed(out, Server(url, True, version), tuple(found), tuple(notes))


def _loaded(m: Listed, running: tuple[ollama_api.RunningModel, ...]) -> Loaded | None:
    from kvadvise.ui.listing import Loaded

    for r in running:
        if (m.digest and r.digest.removeprefix("sha256:") == m.digest) or _same(r.name, m.name):
            return Loaded(r.processor, r.size, r.size_vram, r.context_length)
    return None


# --- the server's settings, from this shell's environment ---------------------


def server_settings(
    n_parallel: int | None, cache_type: str | None, total_vram_bytes: int, flash_attn: bool | None = None
) -> RunSettings:
    """The settings a server started from this shell would run with (flags override the variables: ``None``,
    not given)."""
    from kvadvise.backends.ollama import envconfig
    from kvadvise.backends.ollama.rules import SERVER_KV_CACHE_TYPES, default_num_ctx
    from kvadvise.model.ggml import cache_type as ggml_type
    from kvadvise.planner.inventory import RunSettings

    kv = cache_type or envconfig.var("OLLAMA_KV_CACHE_TYPE").lower() or "f16"
    if kv not in SERVER_KV_CACHE_TYPES:  # the newest release: its llama-server takes it as given
        raise InputError(
            f"OLLAMA_KV_CACHE_TYPE={kv!r} is not a type Ollama's llama-server takes",
            hint=", ".join(SERVER_KV_CACHE_TYPES),
        )
    np = n_parallel or min(envconfig.uint("OLLAMA_NUM_PARALLEL", 0), 4096) or 1
    ctx = min(envconfig.uint("OLLAMA_CONTEXT_LENGTH", 0), 2**31 - 1) or default_num_ctx(total_vram_bytes)
    fa = envconfig.boolean("OLLAMA_FLASH_ATTENTION", True) if flash_attn is None else flash_attn
    return RunSettings(n_parallel=np, flash_attn=fa, cache_type=ggml_type(kv), default_ctx=ctx)


# --- the command ----------------------------------------------------------------

# what only one model can take: a listing of every model refuses it
_NOT_WITH_INSTALLED = ("n_ctx", "use", "target_ctx", "min_ctx", "allow_cpu", "users")


def list_installed(f: Flags, *, host: str | None, sort: str, single_model: tuple[str, ...] = ()) -> None:
    """``kvadvise ollama --installed``: what the listing uses of the request, the rest refused, the table."""
    from kvadvise.backends.ollama.rules import one_cache_type
    from kvadvise.backends.ollama.runtime import OllamaRuntime
    from kvadvise.entry import hardware_of
    from kvadvise.runtime.seam import refuse
    from kvadvise.ui.flags import given_flags, typed
    from kvadvise.ui.listing import show_listing, survey

    r = f.request
    given = [*given_flags(f, _NOT_WITH_INSTALLED), *single_model]
    if given:
        raise click.UsageError(f"--installed lists every model; {', '.join(given)} is for one model: give NAME")
    check(r)
    refuse(OllamaRuntime(), r)
    kv = one_cache_type(r.type_k, r.type_v)
    hw = hardware_of(r)
    from kvadvise.backends.ollama import envconfig
    from kvadvise.backends.ollama.rules import tier_vram_bytes

    # server/routes.go: the tier is over each GPU's total less OLLAMA_GPU_OVERHEAD
    vram = tier_vram_bytes((g.total_bytes for g in hw.gpus), envconfig.gpu_overhead_bytes()) if hw is not None else 0
    explicit = typed(("n_parallel", "flash_attn"))
    np = r.n_parallel if r.n_parallel != 1 or "n_parallel" in explicit else None
    fa = {"on": True, "off": False}.get(r.flash_attn) if "flash_attn" in explicit or r.flash_attn == "off" else None
    settings = server_settings(np, kv, vram, fa)
    with ollama_api.session():
        found = installed(host)
    budget, rows = survey(found.models, settings, hw, r.margin_bytes, headless=r.headless)
    notes = list(found.notes)
    if hw is not None:
        notes += list(hw.notes)
    if not found.models:
        where = ", ".join(str(root) for root in found.roots) or found.server.url
        notes.append(f"no models installed ({where}); `ollama pull NAME` adds one")
    show_listing(
        rows,
        budget,
        settings,
        sort=sort,
        as_json=f.view.as_json,
        show_loaded=found.server.reachable,
        extra_json={"server": asdict(found.server), "stores": [str(root) for root in found.roots]},
        notes=notes,
    )
