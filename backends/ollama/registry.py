"""Ollama's registry: a tag's manifest and its blobs' GGUF headers, read before ``ollama pull``.

The protocol, as Ollama pulls (ollama/ollama@fb307609, 2026-08-21):

- ``server/images.go pullModelManifest``: ``GET {scheme}://{host}/v2/{namespace}/{model}/manifests/{tag}``
  with ``Accept: application/vnd.docker.distribution.manifest.v2+json``; the host, namespace and tag
  of ``types/model/name.go`` (``registry.ollama.ai``, ``library``, ``latest``); ``hf.co/USER/REPO:QUANT``
  is the same request to ``https://hf.co`` (Hugging Face serves the manifests of its GGUF repos);
- ``makeRequestWithRetry``: 404 is "not there" (``os.ErrNotExist``), 401 asks for a token;
- ``server/download.go``: a blob is ``GET /v2/{namespace}/{model}/blobs/{digest}``, which the registry
  answers with a redirect (307) to a blob store that honours ``Range``;
- ``PullModel``: the scheme is https unless the name says ``http://``, and then only with
  ``--insecure`` (``errInsecureProtocol``). kvadvise has no ``--insecure``: it reads an ``http://``
  registry on this machine only (nothing on the way to intercept), as the tests' stand-in does.

So a tag costs one manifest request, then the model blob's header by range reads (two requests for a
262k-token vocabulary: kvadvise.backends.remote.http_source), the projector's header the same way, and the
params blob (``num_ctx``, ``stop``: the model's own options, as in the store). Blobs are content-addressed:
headers are cached by digest and never asked for again; the manifest of a name is kept too, so a name
planned once plans offline (its headers cached). The template layer changes no memory and is not read.

``KVADVISE_OLLAMA_REGISTRY`` replaces ``https://registry.ollama.ai`` (a mirror, a stand-in); ``off``
reads no registry. The environment's proxies (``https_proxy``, ``no_proxy``) are urllib's
(kvadvise.backends.remote.transport).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvadvise.backends.ollama import store as ollama_store
from kvadvise.backends.ollama.model import OllamaModel, has_vision_tower
from kvadvise.backends.ollama.name import DEFAULT_HOST, OllamaName
from kvadvise.backends.ollama.towers import inline_tower
from kvadvise.deadline import within
from kvadvise.errors import BackendUnreachable, InputError, KvadviseError
from kvadvise.files import load_json

if TYPE_CHECKING:
    from kvadvise.model.gguf import GGUFHeader

REGISTRY_ENV = "KVADVISE_OLLAMA_REGISTRY"
DEFAULT_REGISTRY = f"https://{DEFAULT_HOST}"
OFF = ("off", "0", "none", "false", "no")
MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"  # server/images.go pullModelManifest
USER_AGENT = "kvadvise (Ollama registry manifest reader)"
DEADLINE_S = (
    5.0  # one manifest or params request, body included (a few KB): a firewall that drops packets costs 5 s, not 15
)
MAX_JSON_BYTES = ollama_store.MAX_JSON_BYTES  # a manifest or a params blob is a few KB


@dataclass(frozen=True, slots=True)
class Manifest:
    """A tag's manifest as the registry served it."""

    base_url: str  # scheme://host of the registry asked (without a path's trailing /)
    name: OllamaName
    digest: str  # sha256 hex of the manifest bytes: the ID `ollama list` shows once pulled
    layers: tuple[ollama_store.Layer, ...]
    url: str  # the manifest's URL, for messages and the model's source
    text: str  # the manifest as served (kept for offline use; its sha256 is ``digest``)

    def blob_url(self, digest: str) -> str:
        return f"{self.base_url}/v2/{_path(self.name)}/blobs/{digest}"


def registry_url(name: OllamaName) -> str | None:
    """The base URL the registry of ``name`` is asked at; None when ``KVADVISE_OLLAMA_REGISTRY=off``.

    The default host (registry.ollama.ai) is ``KVADVISE_OLLAMA_REGISTRY`` when set; a name with a host of
    its own goes to that host, as Ollama pulls it. InputError for an ``http://`` name off this machine."""
    env = os.environ.get(REGISTRY_ENV, "").strip()
    if env.lower() in OFF and env:
        return None
    from kvadvise.backends.remote import transport  # only when a registry is asked: ~30 ms of start-up

    if name.host.lower() == DEFAULT_HOST and name.scheme == "https":
        if not env:
            return DEFAULT_REGISTRY
        try:
            p = transport.split_url(env)
        except ValueError:
            p = None
        # the value is never echoed: it may hold a password; the model's source and messages show the URL
        if p is None or p.scheme.lower() not in ("http", "https") or not p.hostname:
            raise InputError(
                f"{REGISTRY_ENV} is not a registry URL",
                hint=f"give its base URL, like {DEFAULT_REGISTRY}, or 'off' to read no registry",
            )
        if p.username is not None or p.password is not None or p.query or p.fragment:
            raise InputError(
                f"{REGISTRY_ENV}: a base URL without credentials, query or fragment",
                hint="kvadvise reads public manifests only; a private model plans from the store once pulled",
            )
        return env.rstrip("/")
    if name.scheme not in ("http", "https"):
        raise InputError(f"{name.scheme}://{name.host}: Ollama pulls over https (or http with --insecure)")
    try:
        host = transport.split_url(f"{name.scheme}://{name.host}").hostname or ""
    except ValueError:  # a port that is not a number in 1-65535
        raise InputError(
            f"{name.host}: not a registry host[:port]", hint="names look like host:5000/ns/model:tag"
        ) from None
    if name.scheme == "http" and not transport.is_loopback(host):
        raise InputError(
            f"http://{name.host}: Ollama pulls over http only with --insecure; kvadvise reads http registries "
            "on this machine only",
            hint=f"use https://{name.host}/... if the registry serves https",
        )
    return f"{name.scheme}://{name.host}"


def _path(name: OllamaName) -> str:
    """``namespace/model``, as ``DisplayNamespaceModel`` joins them (each part quoted for the URL)."""
    import urllib.parse

    return f"{urllib.parse.quote(name.namespace, safe='')}/{urllib.parse.quote(name.model, safe='')}"


def manifest_url(base: str, name: OllamaName) -> str:
    import urllib.parse

    return f"{base}/v2/{_path(name)}/manifests/{urllib.parse.quote(name.tag, safe='')}"


def _get(url: str, what: str, *, accept: str | None = None) -> tuple[int, bytes]:
    """The status and body (capped) of one GET, redirects followed, within the deadline."""
    from kvadvise.backends.remote import transport

    shown = transport.display_url(url)
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if accept:
        headers["Accept"] = accept

    def call() -> tuple[int, bytes]:
        try:
            answer = transport.send(url, headers=headers, timeout_s=DEADLINE_S)
        except transport.NoAnswer as e:
            raise BackendUnreachable(f"{shown}: {e.reason}", hint="check the network (or the proxy)") from None
        except transport.BadRedirect as e:
            raise BackendUnreachable(f"{shown}: {e.message}") from None
        resp = answer.response
        try:
            if resp.status != 200:
                return resp.status, b""
            try:
                return 200, transport.read_capped(resp, MAX_JSON_BYTES)
            except transport.TooLarge:
                raise InputError(f"{shown}: the {what} is larger than {MAX_JSON_BYTES:,} bytes") from None
            except transport.NoAnswer as e:
                raise BackendUnreachable(f"{shown}: {e.reason}") from None
        finally:
            resp.close()

    return within(
        DEADLINE_S,
        call,
        lambda: BackendUnreachable(f"{shown}: no complete answer within {DEADLINE_S:g} s", hint="try again later"),
    )


class Refused(InputError):
    """The registry refused a request (401/403): a private model, or none of that name (registries that
    hide which)."""


def _status_error(url: str, status: int, what: str) -> KvadviseError:
    from kvadvise.backends.remote import transport

    shown = transport.display_url(url)
    if status in (401, 403):
        return Refused(
            f"{shown}: the registry refused the {what} (HTTP {status})",
            hint="a private model: `ollama pull` it with your key, then plan it from the store",
        )
    if status == 429 or status >= 500:
        return BackendUnreachable(f"{shown}: the registry answered HTTP {status}", hint="try again later")
    return InputError(f"{shown}: the registry answered HTTP {status} for the {what}")


def fetch_manifest(name: OllamaName, base: str) -> Manifest | None:
    """The manifest of ``name`` at the registry ``base``; None when the registry has no such model or tag
    (404). BackendUnreachable when it cannot be asked, InputError for a manifest that is not one."""
    url = manifest_url(base, name)
    status, data = _get(url, "manifest", accept=MANIFEST_ACCEPT)
    if status == 404:
        return None
    if status != 200:
        raise _status_error(url, status, "manifest")
    return parse_manifest(data, base, name, url)


def parse_manifest(data: bytes, base: str, name: OllamaName, url: str) -> Manifest:
    import hashlib

    from kvadvise.backends.remote import transport

    shown = transport.display_url(url)
    try:
        doc = load_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InputError(f"{shown}: the registry's manifest is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InputError(f"{shown}: the registry's manifest is not a JSON object")
    layers = tuple(ollama_store.manifest_layers(doc, shown))
    return Manifest(base, name, hashlib.sha256(data).hexdigest(), layers, shown, data.decode("utf-8"))


def params_of(manifest: Manifest) -> dict[str, Any]:
    """The params layers' options, merged in order as the store's are (Ollama decodes each in turn)."""
    from kvadvise.backends.remote import transport

    params: dict[str, Any] = {}
    seen: list[str] = []
    for layer in manifest.layers:
        if layer.media_type != ollama_store.MEDIA_PARAMS or layer.digest in seen:
            continue
        seen.append(layer.digest)
        if len(seen) > ollama_store.MAX_PARAMS_LAYERS:
            raise InputError(f"{manifest.url}: the manifest names more than {ollama_store.MAX_PARAMS_LAYERS} params")
        url = manifest.blob_url(layer.digest)
        status, data = _get(url, "params blob")
        if status != 200:
            raise _status_error(url, status, "params blob")
        try:
            doc = load_json(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise InputError(f"{transport.display_url(url)}: the params blob is not valid JSON") from None
        if not isinstance(doc, dict):
            raise InputError(f"{transport.display_url(url)}: the params blob is not a JSON object")
        params.update(doc)
    return params


@dataclass(frozen=True, slots=True)
class Headers:
    """The GGUF headers of a tag's blobs: the model Ollama loads and its (first) projector."""

    model: GGUFHeader
    projector: GGUFHeader | None  # None without a projector layer, or one that could not be read
    projector_error: str | None = None  # why a projector layer was not read


def blob_header(manifest: Manifest, layer: ollama_store.Layer, what: str) -> GGUFHeader:
    """A blob's GGUF header by range reads (through redirects to the blob store), cached by its digest:
    the same bytes forever, so a cached header is used without asking."""
    from kvadvise.backends.gguf_file import remote_header

    return remote_header(
        manifest.blob_url(layer.digest),
        key=f"ollama-blob:{layer.digest}",
        name=f"{manifest.name.display} {what} ({layer.digest[:19]})",
        immutable=layer.digest,
    )


def model_layers(manifest: Manifest) -> list[ollama_store.Layer]:
    """The model layers; InputError for a manifest without one (safetensors, MLX)."""
    models = [la for la in manifest.layers if la.media_type == ollama_store.MEDIA_MODEL]
    if not models:
        tensors = any(la.media_type == ollama_store.MEDIA_TENSOR for la in manifest.layers)
        raise InputError(
            f"{manifest.name.display}: a {'safetensors/MLX' if tensors else 'non-GGUF'} model "
            f"(its manifest has no {ollama_store.MEDIA_MODEL} layer)",
            hint="kvadvise plans GGUF models, which Ollama runs on llama.cpp",
        )
    return models


def projector_layers(manifest: Manifest) -> list[ollama_store.Layer]:
    out: list[ollama_store.Layer] = []
    for la in manifest.layers:
        if la.media_type == ollama_store.MEDIA_PROJECTOR and all(la.digest != o.digest for o in out):
            out.append(la)
    return out


def read_headers(manifest: Manifest) -> Headers:
    """The model blob's header (the last model layer: server/images.go GetModel, each model layer replaces
    the one before) and the first projector's, by range reads or from the cache."""
    from kvadvise.model.projector import projector_from_gguf

    model = blob_header(manifest, model_layers(manifest)[-1], "model blob")
    projectors = projector_layers(manifest)
    if not projectors:
        return Headers(model, None)
    try:
        header = blob_header(manifest, projectors[0], "projector")
        projector_from_gguf(header)  # an mmproj, else the fit-target rule stands in for it
    except InputError as e:
        return Headers(model, None, e.message)
    return Headers(model, header)


def _resolution_key(base: str, name: OllamaName) -> str:
    return f"ollama-registry:{base}|{name.namespace}/{name.model}:{name.tag}".lower()


def today() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def read_model(name: OllamaName, base: str) -> OllamaModel | None:
    """``name`` planned from the registry at ``base`` (:func:`registry_url`): its manifest, the model blob's
    header and the projector's, the params. None when the registry does not have it. BackendUnreachable
    when it cannot be asked and the name was never read here before (else the manifest and params kept
    then)."""
    from kvadvise.backends.remote import cache as remotecache

    key = _resolution_key(base, name)
    said = f"read from the registry before `ollama pull` ({manifest_url(base, name)})"
    try:
        manifest = fetch_manifest(name, base)
        if manifest is None:
            return None
        params = params_of(manifest)
    except BackendUnreachable as e:
        kept = remotecache.load_resolution(key)
        if kept is None or not isinstance(kept.get("manifest"), str) or not isinstance(kept.get("params"), dict):
            raise
        manifest = parse_manifest(kept["manifest"].encode("utf-8"), base, name, manifest_url(base, name))
        params = dict(kept["params"])
        said = f"the registry did not answer ({e.message}); its manifest as read on {kept.get('date', '?')}"
    else:
        remotecache.store_resolution(key, {"manifest": manifest.text, "params": params, "date": today()})
    return build_model(manifest, params, read_headers(manifest), source=f"registry:{manifest.url}", said=said)


def build_model(manifest: Manifest, params: dict[str, Any], headers: Headers, *, source: str, said: str) -> OllamaModel:
    """The model of a tag, as a store entry of the same manifest and blobs gives it (resolve.from_store):
    ``said``, how it was read, is the first of its notes."""
    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.projector import projector_from_gguf

    name = manifest.name
    notes: list[str] = []
    models = model_layers(manifest)
    if len(models) > 1:
        notes.append(f"the manifest has {len(models)} model layers; Ollama loads the last one, planned here")
    layer = models[-1]
    projectors = projector_layers(manifest)
    projector = None
    if headers.projector is not None:
        projector = dataclasses.replace(
            projector_from_gguf(headers.projector), source=manifest.blob_url(projectors[0].digest)
        )
    elif headers.projector_error:
        notes.append(f"projector not read ({headers.projector_error})")
    projector_bytes = sum(la.size for la in projectors)
    if projector_bytes:
        notes.append(f"vision projector: {projector_bytes:,} B (Ollama passes it to llama-server as --mmproj)")
    if any(la.media_type == ollama_store.MEDIA_ADAPTER for la in manifest.layers):
        notes.append("has a LoRA adapter layer; its memory is not counted")
    if any(la.media_type == ollama_store.MEDIA_DRAFT for la in manifest.layers):
        notes.append("has a draft model layer; its memory is not counted")
    spec = from_gguf(headers.model)
    # as a store model's: the layers' notes with the spec's, the blob's address as its source
    spec = dataclasses.replace(spec, source=manifest.blob_url(layer.digest), notes=(*spec.notes, *notes))
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params=params,
        projector_bytes=projector_bytes,
        model_bytes=layer.size,
        source=source,
        notes=(said, *notes),
        digest=manifest.digest,
        projector=projector,
        vision_tower=has_vision_tower(headers.model),
        tower=inline_tower(headers.model),
    )
