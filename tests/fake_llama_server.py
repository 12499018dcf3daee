"""A stand-in for llama-server: replays a log captured from real llama.cpp and
answers /health and /completion the way llama-server does (tools/server).

    python fake_llama_server.py --log FILE [--mode ok|crash|hang|slow-ready|old|amx] [llama-server flags...] --port P

``old`` is a build from before --fit and -lv: it refuses them as llama.cpp's arg parser does. ``amx``: a build with
ggml-cpu's AMX buffer type on a machine where its matmul faults (ggml-org/llama.cpp#20824): without --no-repack it
prints its AMX model buffer and dies of SIGSEGV at the warmup; with it, it runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


def main() -> int:
    argv = sys.argv[1:]
    log = argv[argv.index("--log") + 1]
    mode = argv[argv.index("--mode") + 1] if "--mode" in argv else "ok"
    port = int(argv[argv.index("--port") + 1])
    if mode == "old":
        for flag in ("--fit", "-lv"):
            if flag in argv:
                sys.stdout.write(f"error: invalid argument: {flag}\n")
                return 1
    if mode == "amx" and "--no-repack" not in argv:
        sys.stdout.write("load_tensors:          AMX model buffer size =     9.05 MiB\n")
        sys.stdout.write("common_init_from_params: warming up the model with an empty run - please wait ...\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    with open(log, encoding="utf-8") as f:
        sys.stdout.write(f.read())
    sys.stdout.write(f"main: server is listening on http://127.0.0.1:{port}\n")
    sys.stdout.flush()
    if mode == "crash":
        sys.stdout.write(
            "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n"
        )
        sys.stdout.flush()
        return 1
    if mode == "hang":
        time.sleep(3600)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, code: int, doc: dict[str, object]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            else:
                self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(n) or b"{}")
            n_predict = int(req.get("n_predict", 16))
            # timings as tools/server/server.cpp result_timings::to_json writes them
            self._json(
                200,
                {
                    "content": " lazy dog" * 4,
                    "tokens_predicted": n_predict,
                    "tokens_evaluated": 256,
                    "timings": {
                        "prompt_n": 256,
                        "prompt_ms": 512.0,
                        "prompt_per_token_ms": 2.0,
                        "prompt_per_second": 500.0,
                        "predicted_n": n_predict,
                        "predicted_ms": 1280.0,
                        "predicted_per_token_ms": 20.0,
                        "predicted_per_second": 50.0,
                    },
                },
            )

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
