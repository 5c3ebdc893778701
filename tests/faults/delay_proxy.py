"""A TCP proxy that delays every byte by a fixed time each way, for the fault battery's delay
case: what `tc qdisc add ... netem delay` would add between two hosts. This kernel has no
sch_netem (and nftables cannot delay), so the delay is a process in the path instead: the
clients are given the proxy's address, the proxy forwards to the real one.

Each connection is two one-way pipes; a pipe's reader stamps each chunk it receives and a
writer sends it once its time has come, in order, so the added latency is the delay (plus
a scheduling tick) and the bandwidth is not limited. Every thread is a daemon and every wait
is bounded; close() stops accepting, closes every socket and joins the threads.

    p = DelayProxy(("127.0.0.1", 29410), delay_s=0.02)   # then connect to ("127.0.0.1", p.port)
    ...
    p.close()
"""

import collections
import socket
import threading
import time


class _Pipe:
    """src -> dst, every chunk held for delay_s."""

    def __init__(self, src, dst, delay_s, stopping):
        self.src, self.dst, self.delay, self.stopping = src, dst, delay_s, stopping
        self.queue = collections.deque()
        self.cv = threading.Condition()
        self.eof = False
        self.threads = [threading.Thread(target=self._read, daemon=True), threading.Thread(target=self._write, daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self):
        while not self.stopping.is_set():
            try:
                data = self.src.recv(1 << 16)
            except OSError:
                data = b""
            with self.cv:
                if not data:
                    self.eof = True
                    self.cv.notify()
                    return
                self.queue.append((time.monotonic() + self.delay, data))
                self.cv.notify()

    def _write(self):
        while not self.stopping.is_set():
            with self.cv:
                while not self.queue and not self.eof and not self.stopping.is_set():
                    self.cv.wait(0.1)
                if not self.queue:
                    if self.eof or self.stopping.is_set():
                        break
                    continue
                due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self.cv.wait(min(wait, 0.1))
                    continue
                self.queue.popleft()
            try:
                self.dst.sendall(data)
            except OSError:
                break
        try:  # the other side sees this side's end, after what was in flight
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class DelayProxy:
    def __init__(self, target, delay_s, host="127.0.0.1"):
        self.target, self.delay = target, delay_s
        self.stopping = threading.Event()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(64)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.sockets, self.pipes = [], []
        self.lock = threading.Lock()
        self.connections = 0
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:  # nothing listens there (yet): the client sees a closed connection, as it would
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.connections += 1
                self.sockets += [client, server]
                self.pipes += [_Pipe(client, server, self.delay, self.stopping), _Pipe(server, client, self.delay, self.stopping)]

    def close(self):
        self.stopping.set()
        try:
            self.listener.close()
        except OSError:
            pass
        self.acceptor.join(2)
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            for p in self.pipes:
                for t in p.threads:
                    t.join(2)
