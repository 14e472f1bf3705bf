"""The serving stage, serving only: `bench serve` (api.py: bodies and their translation;
server.py: routes, admission, metrics; deadline.py: slow clients; hosts.py: the loopback
names) and `bench serve --ray` (replicas.py: the same routes on Ray Serve). Load against a
server lives in harness.load."""
