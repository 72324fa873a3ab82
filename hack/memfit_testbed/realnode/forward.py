"""A TCP forwarder from the node's bridge address to the API server on 127.0.0.1.

Pods cannot reach the host's loopback, and the test cluster's kube-apiserver listens only there; the
`kubernetes` Service's EndpointSlice points at this forwarder on the bridge gateway (inside the node's own
pod network), so in-cluster clients (the operator, service-account tokens) reach the API server.
Usage: python -m memfit_testbed.realnode.forward LISTEN_HOST:PORT TARGET_HOST:PORT [--tag TEXT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("listen")
    ap.add_argument("target")
    ap.add_argument("--tag", default="", help="ignored: names the owner in the command line")
    args = ap.parse_args(argv)
    asyncio.run(serve(_addr(args.listen), _addr(args.target)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
