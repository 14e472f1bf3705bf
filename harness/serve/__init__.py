"""The serving stage, serving only. `bench serve`: server.py (routes, the serving loop) over
engine.py (the engine from the scenario), api.py (bodies and their translation), guards.py
(content type, body size and deadline, admission, disconnects), metrics.py (/metrics),
deadline.py (slow request heads) and hosts.py (the loopback names). `bench serve --ray`:
replicas.py (the same routes on Ray Serve) with ray_options.py (its options, checked before Ray
starts). Load against a server lives in harness.load."""
