"""Backend: an Ollama model by name (``qwen3-coder``, ``qwen3:8b``, ``hf.co/user/repo:Q4_K_M``).

Resolution, first that works:

1. the on-disk store (``$OLLAMA_MODELS``, ``~/.ollama/models``, the Linux
   service's ``/usr/share/ollama/.ollama/models``): the GGUF blob's header,
   the params layer, the projector; no server needed;
2. a running server at ``OLLAMA_HOST`` (``/api/show``, verbose);
3. a built-in profile (``profiles/ollama_models.json``), to plan before
   ``ollama pull``.

A server that does not answer is not an error here (the profile may still
plan the model); it is one of the tries the final error lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.architecture import from_gguf
from advisor.errors import BackendUnreachable, InputError
from advisor.headercache import read as read_header
from advisor.spec import ModelSpec
from backends import ollama_api, ollama_store
from backends.ollama_name import OllamaName, parse_name
from backends.ollama_profiles import find_profile, profile_ids

if TYPE_CHECKING:
    from advisor.planning import Plan
    from backends.ollama_advice import LiveState, OllamaAdvice, Written
    from backends.ollama_verify import OllamaVerification


@dataclass(frozen=True, slots=True)
class OllamaModel:
    """An Ollama model, resolved."""

    name: str  # without the default host/namespace and without the tag: "qwen3", "user/m", "hf.co/u/r"
    tag: str
    spec: ModelSpec
    params: dict[str, Any]  # the model's default options (params layer / /api/show parameters): num_ctx, stop, ...
    projector_bytes: int  # vision projector (mmproj) bytes, 0 if none or unknown
    model_bytes: int  # the GGUF blob (store), the tensors (API) or the download size (profile)
    source: str  # "store:<manifest path>" | "api:<host>" | "profile:<id>"
    notes: tuple[str, ...] = ()
    digest: str | None = None  # sha256 of the manifest (store): the ID `ollama ps` shows

    @property
    def ref(self) -> str:
        """``name:tag``, what to give ``ollama run`` / ``FROM``."""
        return f"{self.name}:{self.tag}"

    @property
    def default_num_ctx(self) -> int | None:
        """The model's own num_ctx parameter, if it sets one."""
        v = self.params.get("num_ctx")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def resolve(
    ref: str,
    *,
    host: str | None = None,
    roots: Sequence[Path] | None = None,
    use_api: bool = True,
    use_profiles: bool = True,
    timeout: float = ollama_api.DEFAULT_TIMEOUT,
) -> OllamaModel:
    """Find ``ref`` in the store, then on the server, then in the built-in profiles.

    ``host`` defaults to ``$OLLAMA_HOST``; ``roots`` to the store roots Ollama
    uses. InputError naming every try when none has the model.
    """
    name = parse_name(ref)
    tried: list[str] = []

    search = ollama_store.store_roots() if roots is None else tuple(roots)
    entry = ollama_store.find(name, search)
    if entry is not None:
        return _from_store(name, entry)
    shown_roots = ", ".join(str(r) for r in search) or "none"
    tried.append(f"the model store ({shown_roots}): no manifest for {name.display}")

    server_note: str | None = None
    if use_api:
        url = ollama_api.server_url(host)
        try:
            shown = ollama_api.show_model(url, name.display, timeout=timeout)
        except BackendUnreachable as e:
            tried.append(f"the Ollama server: {e.message}")
            server_note = f"the Ollama server could not be asked ({e.message})"
        else:
            if shown is not None:
                return _from_api(name, url, shown)
            tried.append(f"the Ollama server at {url}: it does not have {name.display}")

    if use_profiles:
        profile = find_profile(name)
        if profile is not None:
            spec = profile.spec()
            notes = (server_note,) if server_note else ()
            if profile.id.lower() != f"{name.model}:{name.tag}".lower():
                notes = (*notes, f"{name.display} is {profile.id} in Ollama's library")
            return OllamaModel(
                name=name.short,
                tag=name.tag,
                spec=spec,
                params={},
                projector_bytes=0,
                model_bytes=profile.download_bytes or 0,
                source=f"profile:{profile.id}",
                notes=notes,  # the profile's own notes are the spec's, printed with the plan
            )
        known = ", ".join(profile_ids())
        tried.append(f"the built-in profiles: none for {name.display} (there are: {known})")

    raise InputError(
        f"{name.display}: not found. Tried " + "; ".join(tried),
        hint=f"ollama pull {name.display}",
    )


def _from_store(name: OllamaName, entry: ollama_store.StoreEntry) -> OllamaModel:
    header = read_header(entry.model_blob)
    spec = from_gguf(header)
    notes = list(entry.notes)
    file_type = entry.config.get("file_type")
    if isinstance(file_type, str) and file_type:
        notes.append(f"quantization {file_type} (from the model's config blob)")
    spec = dataclasses.replace(spec, source=str(entry.model_blob), notes=(*spec.notes, *entry.notes))
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params=dict(entry.params),
        projector_bytes=entry.projector_bytes,
        model_bytes=entry.model_bytes,
        source=f"store:{entry.manifest_path}",
        notes=tuple(notes),
        digest=entry.manifest_digest,
    )


def _from_api(name: OllamaName, url: str, shown: ollama_api.ShownModel) -> OllamaModel:
    spec = from_gguf(shown.header)
    spec = dataclasses.replace(spec, notes=(*spec.notes, *shown.notes))
    notes = list(shown.notes)
    quant = shown.details.get("quantization_level")
    if isinstance(quant, str) and quant:
        notes.append(f"quantization {quant} (from the server)")
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params=dict(shown.params),
        projector_bytes=0,
        model_bytes=spec.weights_bytes,
        source=f"api:{url}",
        notes=tuple(notes),
    )


class OllamaBackend:
    name = "ollama"
    summary = "an Ollama model by name: the local model store, a running server (OLLAMA_HOST), or a built-in profile"

    def load_spec(self, ref: str) -> ModelSpec:
        return resolve(ref).spec

    def resolve(self, ref: str, **kwargs: Any) -> OllamaModel:
        return resolve(ref, **kwargs)

    # The CLI reaches the rest of the Ollama backend through these methods only
    # (advisor never imports backends); the modules load when first used.

    def projector_margin_bytes(self, model: OllamaModel) -> int:
        from backends.ollama_advice import projector_margin_bytes

        return projector_margin_bytes(model)

    def running_models(self, host: str | None = None) -> LiveState:
        """Live state: the server's version and what /api/ps says it holds."""
        from backends.ollama_advice import live_state

        return live_state(host)

    def advise(self, model: OllamaModel, plan: Plan, live: LiveState) -> OllamaAdvice:
        from backends.ollama_advice import advise

        return advise(model, plan, live)

    def advice_dict(self, advice: OllamaAdvice) -> dict[str, object]:
        from backends.ollama_advice import advice_dict

        return advice_dict(advice)

    def advice_text(self, advice: OllamaAdvice) -> str:
        from backends.ollama_advice import advice_text

        return advice_text(advice)

    def write_config(
        self, advice: OllamaAdvice, *, modelfile: str | None, env: str | None, systemd: str | None, force: bool
    ) -> tuple[Written, ...]:
        """Modelfile, env file, systemd drop-in: atomic, never over a file without ``force``."""
        from backends.ollama_advice import write_files

        return write_files(advice, modelfile=modelfile, env=env, systemd=systemd, force=force)

    def verify_running(
        self, name: str, *, host: str | None, load: bool, num_ctx: int | None, predicted_total_bytes: int | None
    ) -> OllamaVerification:
        """After `ollama run`: /api/ps must show size_vram == size and the context asked for."""
        from backends.ollama_verify import verify

        return verify(host, name, load=load, num_ctx=num_ctx, predicted_total_bytes=predicted_total_bytes)
