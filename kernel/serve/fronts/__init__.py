"""Several front processes in front of one set of model instances (`kernel serve --front-processes N`).

With N >= 2 the `kernel serve` process is the supervisor (supervisor.py): it loads the models (one
worker process per instance, never duplicated), serves the metrics port, and runs N fronts
(front.py), each one uvloop with every client transport, all listening on the same ports. A front
talks to each worker over a link of its own (backends/python: no extra hop on the request path);
what needs one owner (sequence batching, callables in the supervisor) is relayed to the supervisor
(relay.py). Everything a client can see stays server-wide through the control channel
(channel.py, messages.py): the front's side is peers.py and mirror.py, the supervisor's hub.py.
ARCHITECTURE.md has the picture.
"""
