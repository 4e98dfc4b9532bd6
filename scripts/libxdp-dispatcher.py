#!/usr/bin/env python3
"""Makes libxdp 1.3.1's dispatcher object (Debian 12) take programs that change packet data.

    libxdp-dispatcher.py IN.o OUT.o

Kernels from 6.13 on refuse to let a program that changes packet data (a tail call
counts, so Syrup's XDP root does) replace a function that does not: "Extension program
changes packet data, while original does not". libxdp's dispatcher is made of such
functions (slots prog0..prog9, each replaced by one program); from libxdp 1.5.5 on each
slot makes a no-op bpf_xdp_adjust_tail(ctx, 0) call so the kernel counts it as changing
packet data. That is the only difference between the 1.3.1 and 1.5.5 dispatchers (both
dispatcher version 2, same configuration layout); libxdp 1.6's object is version 3, which
libxdp 1.3.1 cannot configure (its 124-byte config does not fit the 128-byte .rodata).

This rewrites each slot of the 1.3.1 object in place, six instructions for six, into
    r0 = XDP_ABORTED; if r1 == 0 goto out; r2 = 0; call bpf_xdp_adjust_tail; r0 = 31; out: exit
(the slots never run once a program replaces them; 31 is libxdp's "slot empty" return).
It refuses any object whose slots are not exactly the 1.3.1 instructions (or already
these), so a different libxdp build is never half-patched. Pure byte surgery on the ELF:
no relocation touches the slots, and their line info stays within each function.
"""
import struct
import sys

def insn(op, dst=0, src=0, off=0, imm=0):
    return struct.pack('<BBhi', op, (src << 4) | dst, off, imm)

OLD = b''.join([insn(0xb7, 2, imm=31), insn(0x63, 10, 2, -4), insn(0xb7, 0), insn(0x15, 1, off=1),
                insn(0x61, 0, 10, -4), insn(0x95)])
NEW = b''.join([insn(0xb7, 0), insn(0x15, 1, off=3), insn(0xb7, 2), insn(0x85, imm=65),  # 65: bpf_xdp_adjust_tail
                insn(0xb7, 0, imm=31), insn(0x95)])
SLOTS = [f'prog{i}'.encode() for i in range(10)]

def sections(d):
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, _ = struct.unpack_from('<HHH', d, 0x3a)
    return [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]

def main(src, dst):
    d = bytearray(open(src, 'rb').read())
    if d[:4] != b'\x7fELF' or d[4] != 2 or d[5] != 1:
        sys.exit(f'{src}: not a little-endian ELF64 object')
    secs = sections(d)
    symtab = next((s for s in secs if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        sys.exit(f'{src}: no symbol table')
    strtab = secs[symtab[6]]
    done = []
    for off in range(symtab[4], symtab[4] + symtab[5], 24):
        name, info, _, shndx, value, size = struct.unpack_from('<IBBHQQ', d, off)
        start = strtab[4] + name
        sym = bytes(d[start:d.index(b'\0', start)])
        if sym not in SLOTS:
            continue
        at = secs[shndx][4] + value
        body = bytes(d[at:at + len(OLD)])
        if size != len(OLD) or body not in (OLD, NEW):
            sys.exit(f'{src}: slot {sym.decode()} is not libxdp 1.3.1\'s ({size} bytes): refusing to patch')
        d[at:at + len(NEW)] = NEW
        done.append(sym)
    if sorted(done) != sorted(SLOTS):
        sys.exit(f'{src}: found slots {[s.decode() for s in done]}, expected prog0..prog9')
    with open(dst + '.tmp', 'wb') as f:
        f.write(d)
    import os
    os.replace(dst + '.tmp', dst)

if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
