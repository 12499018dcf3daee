"""Ollama model names: ``[host/][namespace/]model[:tag]``, as Ollama parses them.

Follows ``types/model/name.go`` (Ollama HEAD): ``ParseNameBare`` cuts the tag
at the last ``:`` that comes after the last ``/``, then the model, namespace
and host from the right; ``ParseName`` fills the defaults
(``registry.ollama.ai/library/…:latest``); ``isValidPart`` checks each part.
So ``qwen3``, ``qwen3:8b``, ``user/model:tag``, ``host/user/model:tag`` and
``hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`` all parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.errors import InputError

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
_MISSING = "!MISSING!"  # name.go MissingPart: a separator with nothing on one side

# name.go isValidLen: host up to 350 bytes, every other part up to 80
_MAX_LEN = {"host": 350, "namespace": 80, "model": 80, "tag": 80}


@dataclass(frozen=True, slots=True)
class OllamaName:
    """A model name as Ollama parses it: [host/][namespace/]model[:tag]."""

    host: str
    namespace: str
    model: str
    tag: str
    # name.go ParseNameBare keeps a scheme written before the host ("http://host/ns/model"); Ollama pulls
    # over https unless the name says http, and then only with --insecure (server/images.go PullModel)
    scheme: str = "https"

    @property
    def is_library(self) -> bool:
        """A model of Ollama's own library (the default host and namespace)."""
        return self.host.lower() == DEFAULT_HOST and self.namespace.lower() == DEFAULT_NAMESPACE

    @property
    def short(self) -> str:
        """The name without the default host and namespace, without the tag (``qwen3``, ``user/m``)."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}"
        return self.model

    @property
    def display(self) -> str:
        """``short:tag``, as ``ollama list`` shows it."""
        return f"{self.short}:{self.tag}"

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    def manifest_parts(self) -> tuple[str, str, str, str]:
        """The path of the manifest below ``manifests/`` (name.go Filepath)."""
        return (self.host, self.namespace, self.model, self.tag)

    def same_model(self, other: OllamaName) -> bool:
        """Name.EqualFold: the same model, ignoring case."""
        return self.full.lower() == other.full.lower()


def _cut_last(s: str, sep: str) -> tuple[str, str, bool]:
    i = s.rfind(sep)
    if i < 0:
        return s, "", False
    return s[:i], s[i + len(sep) :], True


def _cut_promised(s: str, sep: str) -> tuple[str, str, bool]:
    before, after, ok = _cut_last(s, sep)
    if not ok:
        return before, after, False
    return before or _MISSING, after or _MISSING, True


def _alnum_or_underscore(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def _valid_part(kind: str, s: str) -> bool:
    """name.go isValidPart."""
    if not s or len(s.encode("utf-8", "surrogateescape")) > _MAX_LEN[kind]:  # argv may not be UTF-8
        return False
    for i, c in enumerate(s):
        if i == 0:
            if not _alnum_or_underscore(c):
                return False
            continue
        if c in "_-":
            continue
        if c == ".":
            if kind == "namespace":
                return False
            continue
        if c == ":":
            if kind != "host":
                return False
            continue
        if not _alnum_or_underscore(c):
            return False
    return True


def parse_name(ref: str) -> OllamaName:
    """Parse an Ollama model reference; defaults fill what is missing. Raises InputError."""
    s = ref.strip()
    if not s:
        raise InputError("empty model name", hint="give a name like qwen3-coder or qwen3:8b")
    host = namespace = tag = ""
    scheme = "https"
    rest = s
    # "/" is an illegal tag character, so a ":" after the last "/" starts the tag
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag, _ = _cut_promised(rest, ":")
    rest, model, promised = _cut_promised(rest, "/")
    if not promised:
        model = rest
    else:
        rest, namespace, promised = _cut_promised(rest, "/")
        if not promised:
            namespace = rest
        else:
            before, sep, after = rest.partition("://")
            host = after if sep else before
            scheme = before.lower() if sep else scheme
    name = OllamaName(
        host=host or DEFAULT_HOST,
        namespace=namespace or DEFAULT_NAMESPACE,
        model=model,
        tag=tag or DEFAULT_TAG,
        scheme=scheme,
    )
    for kind, part in zip(("host", "namespace", "model", "tag"), name.manifest_parts(), strict=True):
        if not _valid_part(kind, part):
            shown = "nothing" if part in ("", _MISSING) else repr(part)
            raise InputError(
                f"{ref!r} is not a valid Ollama model name: the {kind} is {shown}",
                hint="names look like qwen3-coder, qwen3:8b, user/model:tag or hf.co/user/repo:Q4_K_M",
            )
    return name
