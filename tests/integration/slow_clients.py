"""Slow HTTP clients, as a process of their own (tests/integration/test_http_hostile.py).

    python3 slow_clients.py HOST:PORT SRC=N [SRC=N ...]

opens N connections bound to each source address SRC (127.0.0.x), sends each a
partial request (a request line and the start of a header) and then one more
byte of that header every EVERY seconds (env SLOW_EVERY, default 2), and opens
again any connection the server closed when its turn comes: the attack lasts
as long as the process.  It prints "ready OPENED" once every connection is
open and, on SIGTERM, "done OPENED REOPENED" before it exits.

After the first round the connections are visited in small batches spread
over each EVERY seconds, the addresses interleaved: slow clients, each at its
own pace, not a flood of reconnections from one address at one instant (an
attacker who can open http_conns_per_ip connections from the prober's own
address between the prober's connect and its request can displace it; see
docs/security.md).  It runs in its own process, not in a thread of the test,
so that it never holds the test's interpreter lock between a prober's connect
and its request.
"""

import resource
import signal
import socket
import sys
import threading

PREFIX = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
BATCHES = 50  # visits per EVERY seconds, each to every 50th connection


class Slow:
    def __init__(self, target, plan):
        self.target = target
        # round-robin over the addresses, so that a batch holds a few of each
        left = dict(plan)
        self.slots = []
        while left:
            for src in list(left):
                self.slots.append(src)
                left[src] -= 1
                if not left[src]:
                    del left[src]
        self.socks = [None] * len(self.slots)
        self.sent = [False] * len(self.slots)
        self.opened = self.reopened = 0

    def open(self, i):
        s = socket.socket()
        s.setblocking(False)
        s.bind((self.slots[i], 0))
        s.connect_ex(self.target)  # in progress or done; the server may close it: reopened
        self.socks[i], self.sent[i] = s, False
        self.opened += 1

    @staticmethod
    def closed(s):
        try:
            return s.recv(1, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def round(self, batch=None):
        for i in range(len(self.slots)) if batch is None else batch:
            s = self.socks[i]
            if s is None:
                self.open(i)
                continue
            if self.closed(s):
                s.close()
                self.reopened += 1
                self.open(i)
                continue
            try:
                s.send(b"a" if self.sent[i] else PREFIX)
                self.sent[i] = True
            except (BlockingIOError, InterruptedError):
                pass  # not connected yet (queued by the kernel): next round
            except OSError:
                s.close()
                self.reopened += 1
                self.open(i)


def main(argv):
    host, port = argv[1].rsplit(":", 1)
    plan = [(a.split("=")[0], int(a.split("=")[1])) for a in argv[2:]]
    n = sum(k for _, k in plan)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * n + 256), hard))
    every = float(__import__("os").environ.get("SLOW_EVERY", "2"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    slow = Slow((host, int(port)), plan)
    slow.round()
    print(f"ready {slow.opened}", flush=True)
    batches = [range(i, n, BATCHES) for i in range(BATCHES)]
    while not stop.is_set():
        for b in batches:
            if stop.wait(every / BATCHES):
                break
            slow.round(b)
    print(f"done {slow.opened} {slow.reopened}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
