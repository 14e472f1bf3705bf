"""Fake `sglang.launch_server`: SGLang 0.5.23's routes and answer shapes, made-up numbers.

Scores: row i of /v1/score puts probability len(item)/(len(item)+1) on the first label and
spreads the rest evenly, so a test can tell which item a row came from. Beams: beam j is
[prompt[-1] + j] * max_new_tokens with sequence_score -(j + 1). Like the real server it
forks a child (the "scheduler") into its process group. `--fail-startup` exits at once;
`--hang-s N` sleeps N s before answering a /generate.
"""
import argparse
import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, default=30000)
p.add_argument("--fail-startup", action="store_true")
p.add_argument("--hang-s", type=float, default=0.0)
args, rest = p.parse_known_args()
if args.fail_startup:
    print("fake sglang: refusing to start (--fail-startup)", flush=True)
    sys.exit(3)

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
INFO = {"version": "0.0-fake", "device": "cpu", "dtype": "float32", "attention_backend": "torch_native",
        "launch_command": " ".join(sys.argv[1:]), "scheduler_pid": child.pid}


def scores(items, labels):
    rows = []
    for item in items:
        first = len(item) / (len(item) + 1)
        rows.append([first] + [(1 - first) / (len(labels) - 1)] * (len(labels) - 1))
    return rows


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, {})
        if self.path == "/server_info":
            return self._send(200, INFO)
        self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/score":
            if len(set(body["label_token_ids"])) != len(body["label_token_ids"]):
                return self._send(400, {"object": "error", "message": "label_token_ids must not contain duplicate tokens"})
            return self._send(200, {"scores": scores([body["query"] + i for i in body["items"]],
                                                      body["label_token_ids"]), "object": "scoring"})
        if self.path == "/generate":
            time.sleep(args.hang_s)
            sp = body["sampling_params"]
            last, n = body["input_ids"][-1], sp["max_new_tokens"]
            beams = [{"output_ids": [last + j] * n, "text": f"beam{j}",
                      "meta_info": {"sequence_score": -(j + 1.0), "finish_reason": {"type": "length"}}}
                     for j in range(sp["n"])]
            return self._send(200, {"text": "beam0", "output_ids": beams[0]["output_ids"],
                                    "meta_info": {"beam_results": beams}})
        self._send(404, {"detail": "Not Found"})


print(f"fake sglang listening on {args.host}:{args.port}", flush=True)
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
