"""How evenly do N processes share a port's connections: one listening socket they all inherit, or
SO_REUSEPORT (a socket each)? The choice behind kernel/transports/listen.py.

Each process runs a uvloop server that counts the connections it accepts; the client opens C
connections at once (or paced, 1 ms apart) and the script prints each process's count and the
busiest one's share over an even split (1.00 = perfectly even).

    python benchmarks/front_spread.py            # N = 2 and 4, C = 64 and 256
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import socket
import time


def _serve(mode: str, port: int, fd: int, index: int, seen, ready, seconds: float) -> None:
    import uvloop

    async def main() -> None:
        if mode == "inherited":
            sock = socket.socket(fileno=fd)
        else:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(1024)

        async def handle(reader, writer) -> None:
            seen.put(index)
            try:
                while await reader.read(100):
                    pass
            except ConnectionError:
                pass

        await asyncio.start_server(handle, sock=sock)
        ready.set()
        await asyncio.sleep(seconds)

    uvloop.run(main())


def spread(mode: str, processes: int, connections: int, paced: bool) -> list[int]:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode == "reuseport":
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    if mode == "inherited":
        holder.listen(1024)
    seen = mp.Queue()
    procs, readies = [], []
    for i in range(processes):
        ready = mp.Event()
        p = mp.Process(target=_serve, args=(mode, port, holder.fileno(), i, seen, ready, 4.0))
        p.start()
        procs.append(p)
        readies.append(ready)
    for ready in readies:
        ready.wait(10)
    clients = []
    for _ in range(connections):
        clients.append(socket.create_connection(("127.0.0.1", port)))
        if paced:
            time.sleep(0.001)
    counts = collections.Counter(seen.get(timeout=10) for _ in range(connections))
    for c in clients:
        c.close()
    for p in procs:
        p.join()
    holder.close()
    return [counts[i] for i in range(processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--connections", type=int, nargs="+", default=[64, 256])
    args = parser.parse_args()
    mp.set_start_method("fork")
    print("| mode | processes | connections | paced | per process | busiest / even |")
    print("| --- | ---: | ---: | --- | --- | ---: |")
    for mode in ("inherited", "reuseport"):
        for n in args.processes:
            for c in args.connections:
                for paced in (False, True):
                    counts = spread(mode, n, c, paced)
                    print(f"| {mode} | {n} | {c} | {paced} | {counts} | {max(counts) / (c / n):.2f} |")


if __name__ == "__main__":
    main()
