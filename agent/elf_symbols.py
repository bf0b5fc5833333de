"""Find the default-version definition of an exported function in a shared library.

BCC resolves `sym=` to the first `.dynsym` entry with that name, but versioned libraries export
one name several times: libibverbs.so.1 has `ibv_create_qp@IBVERBS_1.0` (a compat shim for
the 1.0 struct layout) before `ibv_create_qp@@IBVERBS_1.1`, which is what every program built
in this century (and NCCL's `dlvsym(..., "IBVERBS_1.1")`) calls. A uprobe on the first entry
never fires. This reads `.dynsym` with `.gnu.version`/`.gnu.version_d` and returns the default
(non-hidden) version, whose address is passed to BCC as `addr=`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SHT_DYNSYM = 11
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERSYM = 0x6FFFFFFF
STT_FUNC = 2
STT_GNU_IFUNC = 10
SHN_UNDEF = 0
VERSYM_HIDDEN = 0x8000  # set on non-default versions (name@VER, not name@@VER)


class ElfError(ValueError):
    """The file is not a readable 64-bit ELF, or the symbol is not defined in it."""


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int  # st_value: virtual address in the file's load segments
    size: int
    version: str | None  # e.g. "IBVERBS_1.1"; None for an unversioned library


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class _Elf:
    def __init__(self, path: Path) -> None:
        try:
            self.data = path.read_bytes()
        except OSError as exc:
            raise ElfError(f"{path}: {exc.strerror}") from None
        d = self.data
        if len(d) < 64 or d[:4] != b"\x7fELF":
            raise ElfError(f"{path}: not an ELF file")
        if d[4] != 2:
            raise ElfError(f"{path}: not a 64-bit ELF")
        self.end = "<" if d[5] == 1 else ">"
        self.machine = self._u("H", 18)
        shoff = self._u("Q", 40)
        shentsize, shnum = self._u("H", 58), self._u("H", 60)
        self.sections = []
        for i in range(shnum):
            base = shoff + i * shentsize
            if base + 64 > len(d):
                raise ElfError(f"{path}: truncated section headers")
            self.sections.append(_Section(self._u("I", base + 4), self._u("Q", base + 24),
                                          self._u("Q", base + 32), self._u("I", base + 40),
                                          self._u("Q", base + 56)))

    def _u(self, fmt: str, off: int) -> int:
        value: int = struct.unpack_from(self.end + fmt, self.data, off)[0]
        return value

    def cstr(self, section: _Section, off: int) -> str:
        start = section.offset + off
        return self.data[start:self.data.index(b"\0", start)].decode(errors="replace")

    def section(self, sh_type: int) -> _Section | None:
        return next((s for s in self.sections if s.type == sh_type), None)

    def version_names(self) -> dict[int, str]:
        """Version index -> name, from .gnu.version_d."""
        verdef = self.section(SHT_GNU_VERDEF)
        if verdef is None:
            return {}
        strtab = self.sections[verdef.link]
        names, off = {}, verdef.offset
        while True:
            ndx, aux, nxt = self._u("H", off + 4), self._u("I", off + 12), self._u("I", off + 16)
            names[ndx] = self.cstr(strtab, self._u("I", off + aux))
            if nxt == 0:
                return names
            off += nxt


def elf_machine(path: Path) -> int:
    """e_machine of a 64-bit ELF file (62: x86-64, 183: AArch64)."""
    return _Elf(path).machine


def find_function(path: Path, name: str) -> Symbol:
    """The definition of function `name` that a dynamic link against `path` binds to."""
    try:
        return _find_function(path, name)
    except (struct.error, IndexError, ValueError) as exc:
        if isinstance(exc, ElfError):
            raise
        raise ElfError(f"{path}: malformed ELF ({exc})") from None


def _find_function(path: Path, name: str) -> Symbol:
    elf = _Elf(path)
    dynsym = elf.section(SHT_DYNSYM)
    if dynsym is None or dynsym.entsize != 24:
        raise ElfError(f"{path}: no 64-bit .dynsym section")
    strtab = elf.sections[dynsym.link]
    versym = elf.section(SHT_GNU_VERSYM)
    versions = elf.version_names()
    for i in range(dynsym.size // 24):
        base = dynsym.offset + i * 24
        info, shndx = elf.data[base + 4], elf._u("H", base + 6)
        if shndx == SHN_UNDEF or (info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
            continue
        if elf.cstr(strtab, elf._u("I", base)) != name:
            continue
        ver = elf._u("H", versym.offset + 2 * i) if versym else 1
        if ver & VERSYM_HIDDEN:
            continue
        # Index 1 is the file's base definition (its soname): the symbol is unversioned.
        version = versions.get(ver) if ver > 1 else None
        return Symbol(name, elf._u("Q", base + 8), elf._u("Q", base + 16), version)
    raise ElfError(f"{path} does not export a default version of {name}()")
