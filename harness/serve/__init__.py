"""The HTTP side of the harness: `bench serve` (api.py: bodies and their translation;
server.py: routes, admission, metrics; process.py: the server as a child process),
`bench load` (load.py + locustfile.py: Locust against any SGLang-compatible server) and
`bench soak` (soak.py)."""
