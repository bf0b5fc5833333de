"""The c4 NCCL profiler plugin driven through its exported API (ctypes), as NCCL does.

Only the ABI is used: the `ncclProfiler_v5` symbol and the v5 descriptor and state-argument
layouts (NCCL's profiler_v5.h; plugin/src/abi.h declares the same). The lab's workload calls
it where NCCL would: the application thread starts a Coll and stops it once enqueued; the
proxy side starts a ProxyOp per (peer, channel, direction) and a ProxyStep per chunk, records
the step's states around the real socket operations, and stops them.
"""
from __future__ import annotations

import ctypes as C
import os
from pathlib import Path

EV_COLL = 1 << 1
EV_PROXY_OP = 1 << 3
EV_PROXY_STEP = 1 << 4

SEND_GPU_WAIT = 8
SEND_WAIT = 9
RECV_WAIT = 10
RECV_FLUSH_WAIT = 11
RECV_GPU_WAIT = 12
SEND_PEER_WAIT = 20

REPO_LIB = Path(__file__).resolve().parents[1] / "plugin" / "build" / "libnccl-profiler-c4.so"


class _Coll(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p),
                ("recvBuff", C.c_void_p), ("count", C.c_size_t), ("root", C.c_int),
                ("datatype", C.c_char_p), ("nChannels", C.c_uint8), ("nWarps", C.c_uint8),
                ("algo", C.c_char_p), ("proto", C.c_char_p), ("parentGroup", C.c_void_p)]


class _ProxyOp(C.Structure):
    _fields_ = [("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int),
                ("nSteps", C.c_int), ("chunkSize", C.c_int), ("isSend", C.c_int)]


class _ProxyStep(C.Structure):
    _fields_ = [("step", C.c_int)]


class _Union(C.Union):
    # the largest v5 member (coll) fixes the union's size, as in the C header
    _fields_ = [("coll", _Coll), ("proxyOp", _ProxyOp), ("proxyStep", _ProxyStep)]


class Descr(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int),
                ("u", _Union)]


class StateArgs(C.Union):
    _fields_ = [("transSize", C.c_size_t), ("_pad", C.c_uint64 * 2)]


LOGGER = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p)
_INIT = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint64, C.POINTER(C.c_int), C.c_char_p,
                    C.c_int, C.c_int, C.c_int, LOGGER)
_START = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(Descr))
_STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)
_RECORD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgs))
_FINALIZE = C.CFUNCTYPE(C.c_int, C.c_void_p)


class _V5(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", _INIT), ("startEvent", _START),
                ("stopEvent", _STOP), ("recordEventState", _RECORD), ("finalize", _FINALIZE)]


@LOGGER
def _log(level: int, flags: int, file: bytes | None, line: int, fmt: bytes | None) -> None:
    if level <= 2 and fmt:  # WARN and worse; the format's arguments are not passed through
        print(f"c4 profiler: {fmt.decode(errors='replace').strip()}", flush=True)


class Profiler:
    """One communicator's view of the plugin (one `init`)."""

    def __init__(self, comm_id: int, nranks: int, rank: int, nnodes: int,
                 lib: str | os.PathLike[str] | None = None) -> None:
        path = str(lib or os.environ.get("C4_PLUGIN_LIB") or REPO_LIB)
        self._dll = C.CDLL(path)
        self._api = _V5.in_dll(self._dll, "ncclProfiler_v5")
        self._ctx = C.c_void_p()
        self._mask = C.c_int(0)
        self.rank = rank
        self._api.init(C.byref(self._ctx), comm_id, C.byref(self._mask), b"c4-lab", nnodes,
                       nranks, rank, _log)
        self._pid = os.getpid()

    @property
    def active(self) -> bool:
        return bool(self._ctx.value) and bool(self._mask.value & EV_PROXY_STEP)

    def _start(self, d: Descr) -> int | None:
        if not self._ctx.value or not self._mask.value & d.type:
            return None  # NCCL starts only the events in the activation mask
        h = C.c_void_p()
        self._api.startEvent(self._ctx, C.byref(h), C.byref(d))
        return h.value

    def coll(self, seq: int, count: int, nchannels: int) -> int | None:
        d = Descr(type=EV_COLL, rank=self.rank)
        d.coll.seqNumber = seq
        d.coll.func = b"AllReduce"
        d.coll.count = count
        d.coll.datatype = b"ncclFloat32"
        d.coll.nChannels = nchannels
        d.coll.algo = b"Ring"
        d.coll.proto = b"Simple"
        return self._start(d)

    def proxy_op(self, parent: int | None, peer: int, channel: int, is_send: bool,
                 nsteps: int, chunk: int) -> int | None:
        d = Descr(type=EV_PROXY_OP, rank=self.rank, parentObj=parent)
        d.proxyOp.pid = self._pid
        d.proxyOp.channelId = channel
        d.proxyOp.peer = peer
        d.proxyOp.nSteps = nsteps
        d.proxyOp.chunkSize = chunk
        d.proxyOp.isSend = int(is_send)
        return self._start(d)

    def step(self, parent: int | None, step: int) -> int | None:
        d = Descr(type=EV_PROXY_STEP, rank=self.rank, parentObj=parent)
        d.proxyStep.step = step
        return self._start(d)

    def state(self, handle: int | None, state: int, trans_size: int = 0) -> None:
        if handle:
            self._api.recordEventState(handle, state, C.byref(StateArgs(transSize=trans_size)))

    def stop(self, handle: int | None) -> None:
        if handle:
            self._api.stopEvent(handle)

    def finalize(self) -> None:
        if self._ctx.value:
            self._api.finalize(self._ctx)
            self._ctx = C.c_void_p()
