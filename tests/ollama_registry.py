"""A loopback stand-in for Ollama's registry, serving what an on-disk store holds.

It answers as registry.ollama.ai does for ``ollama pull`` (ollama/ollama@fb307609 server/images.go
pullModelManifest, server/download.go): ``GET /v2/{namespace}/{model}/manifests/{tag}`` is the manifest
JSON, ``GET /v2/{namespace}/{model}/blobs/{digest}`` a 307 redirect to a blob store (another loopback
origin) that serves ``/blobs/{digest}`` with Range; anything else is 404. Built from a store that
``ollama_fake.build_store`` wrote, so a model planned from the registry and from the store are the same
bytes: the plans must be equal.
"""

from __future__ import annotations

from pathlib import Path

from http_fixtures import LoopbackServer, Route


class StandInRegistry:
    """``with StandInRegistry() as r: r.serve(store_root)``; ``r.origin`` is the registry's base URL."""

    def __init__(self) -> None:
        self.registry = LoopbackServer()
        self.blobs = LoopbackServer()  # the blob store: another origin, as Ollama's CDN is

    def __enter__(self) -> StandInRegistry:
        self.registry.__enter__()
        self.blobs.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.registry.close()
        self.blobs.close()

    @property
    def origin(self) -> str:
        return self.registry.origin

    def serve(self, root: Path, host: str = "registry.ollama.ai") -> None:
        """Every manifest of the store ``root`` under ``host``, and every blob it holds."""
        for manifest in sorted((root / "manifests" / host).glob("*/*/*")):
            namespace, model, tag = manifest.parts[-3:]
            self.registry.add(f"/v2/{namespace}/{model}/manifests/{tag}", Route(data=manifest.read_bytes()))
            for blob in sorted((root / "blobs").iterdir()):
                digest = blob.name.replace("sha256-", "sha256:", 1)
                self.blob(namespace, model, digest, blob)

    def blob(
        self, namespace: str, model: str, digest: str, file: Path | None = None, data: bytes | None = None
    ) -> None:
        """The registry's redirect for one blob and the blob store's file (or bytes) behind it."""
        target = self.blobs.add(f"/blobs/{digest}", Route(file=file, data=data))
        self.registry.add(f"/v2/{namespace}/{model}/blobs/{digest}", Route(redirect=target, redirect_status=307))

    def manifest(self, namespace: str, model: str, tag: str, data: bytes) -> None:
        self.registry.add(f"/v2/{namespace}/{model}/manifests/{tag}", Route(data=data))
