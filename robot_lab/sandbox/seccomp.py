"""The seccomp filter every bwrap call runs under: no ``ptrace`` of anything.

Inside bwrap a script shares its uid with the sandbox's pid 1 (bwrap itself), so the
kernel lets it ``ptrace(PTRACE_ATTACH, 1)``: the init process stops, and the call hangs
until its timeout. Dropping every capability (``--cap-drop ALL``) does not help where the
uids match, and there may be no Yama LSM to refuse it; a seccomp filter does, whatever the
uid: ``ptrace``, ``process_vm_readv`` and ``process_vm_writev`` fail at once with ``EPERM``.

The program is a classic BPF array written by hand (:func:`program`), for bwrap's
``--seccomp FD``: libseccomp's Python binding is not on PyPI (only distribution packages
and forks), and the filter is a dozen instructions: check the architecture, compare the
syscall number, allow or return ``EPERM``. An architecture not listed is allowed through:
the filter narrows, it never breaks a script.
"""

from __future__ import annotations

import errno
import os
import struct

# <linux/filter.h> and <linux/seccomp.h>
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data

_X32 = 0x40000000  # the x32 ABI's syscall bit, under the x86_64 audit arch
# audit arch -> the syscall numbers of ptrace, process_vm_readv, process_vm_writev
DENIED: dict[int, tuple[int, ...]] = {
    0xC000003E: (101, 310, 311, _X32 | 101, _X32 | 310, _X32 | 311, _X32 | 521, _X32 | 539, _X32 | 540),  # x86_64, x32
    0x40000003: (26, 347, 348),  # i386 (ia32 binaries on x86_64)
    0xC00000B7: (117, 270, 271),  # aarch64
    0x40000028: (26, 376, 377),  # arm (32-bit binaries on aarch64)
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter as ``struct sock_filter[]`` bytes, in the machine's byte order.

    Layout: load the arch; per listed arch a ``jeq arch`` that skips its block when it
    differs, and a block loading the syscall number with one ``jeq`` per denied number
    (jumping to the final ``EPERM``) then ``ALLOW``; after the blocks ``ALLOW``, ``EPERM``.
    """
    blocks = [(arch, numbers) for arch, numbers in DENIED.items()]
    total = 1 + sum(2 + len(numbers) + 1 for _, numbers in blocks) + 2
    deny = total - 1
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH)]
    for arch, numbers in blocks:
        out.append(_insn(_JEQ_K, 0, 1 + len(numbers) + 1, arch))
        out.append(_insn(_LD_W_ABS, 0, 0, _NR))
        for number in numbers:
            out.append(_insn(_JEQ_K, deny - len(out) - 1, 0, number))
        out.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    out.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    out.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    assert len(out) == total
    return b"".join(out)


def program_fd() -> int:
    """A readable pipe holding :func:`program` (bwrap reads it to the end once): the
    caller passes it to the bwrap process and closes it after the start."""
    read, write = os.pipe()
    try:
        os.write(write, program())  # a few hundred bytes: within any pipe's buffer
    finally:
        os.close(write)
    return read


__all__ = ["DENIED", "program", "program_fd"]
