//! A small eBPF assembler: the instruction encoding of `linux/bpf.h`, forward and backward
//! labels, and map references. Enough for the programs in [`super::prog`], no more.

/// One `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    code: u8,
    regs: u8, // dst in the low nibble, src in the high
    off: i16,
    imm: i32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == 8);

pub(crate) type Reg = u8;
pub(crate) const R0: Reg = 0;
pub(crate) const R1: Reg = 1;
pub(crate) const R2: Reg = 2;
pub(crate) const R3: Reg = 3;
pub(crate) const R4: Reg = 4;
pub(crate) const R5: Reg = 5;
pub(crate) const R6: Reg = 6;
pub(crate) const R7: Reg = 7;
pub(crate) const R8: Reg = 8;
pub(crate) const R9: Reg = 9;
pub(crate) const R10: Reg = 10;

// Classes, sizes, modes, operations.
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
const K: u8 = 0x00;
const X: u8 = 0x08;

/// Access sizes.
#[derive(Clone, Copy)]
pub(crate) enum Size {
    W = 0x00,
    DW = 0x18,
}

/// ALU operations.
#[derive(Clone, Copy)]
pub(crate) enum Alu {
    Add = 0x00,
    Sub = 0x10,
    Mul = 0x20,
    Or = 0x40,
    And = 0x50,
    Lsh = 0x60,
    Rsh = 0x70,
    Mov = 0xb0,
    Xor = 0xa0,
}

/// Conditional jumps (unsigned comparisons).
#[derive(Clone, Copy)]
pub(crate) enum Jmp {
    Eq = 0x10,
    Gt = 0x20,
    Ge = 0x30,
    Set = 0x40,
    Ne = 0x50,
    Le = 0xb0,
}

/// Helper function ids.
pub(crate) const MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const MAP_UPDATE_ELEM: i32 = 2;
pub(crate) const MAP_DELETE_ELEM: i32 = 3;
pub(crate) const GET_CURRENT_PID_TGID: i32 = 14;
pub(crate) const PROBE_READ_USER: i32 = 112;

/// A jump target, bound once with [`Asm::bind`].
#[derive(Clone, Copy)]
pub(crate) struct Label(usize);

/// A program under construction.
#[derive(Default)]
pub(crate) struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0xf) | (src << 4),
        off,
        imm,
    }
}

impl Asm {
    pub(crate) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    pub(crate) fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    fn push(&mut self, i: Insn) -> &mut Self {
        self.insns.push(i);
        self
    }

    pub(crate) fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) -> &mut Self {
        self.push(insn(ALU64 | op as u8 | K, dst, 0, 0, imm))
    }

    pub(crate) fn alu_reg(&mut self, op: Alu, dst: Reg, src: Reg) -> &mut Self {
        self.push(insn(ALU64 | op as u8 | X, dst, src, 0, 0))
    }

    pub(crate) fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.alu_imm(Alu::Mov, dst, imm)
    }

    pub(crate) fn mov(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.alu_reg(Alu::Mov, dst, src)
    }

    /// `dst = *(size *)(src + off)`
    pub(crate) fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) -> &mut Self {
        self.push(insn(LDX | MEM | size as u8, dst, src, off, 0))
    }

    /// `*(size *)(dst + off) = src`
    pub(crate) fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.push(insn(STX | MEM | size as u8, dst, src, off, 0))
    }

    /// `*(size *)(dst + off) = imm`
    pub(crate) fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) -> &mut Self {
        self.push(insn(ST | MEM | size as u8, dst, 0, off, imm))
    }

    /// `lock *(u64 *)(dst + off) += src`
    pub(crate) fn atomic_add(&mut self, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.push(insn(STX | ATOMIC | Size::DW as u8, dst, src, off, 0))
    }

    /// `src = atomic_fetch_add((u64 *)(dst + off), src)` (a full barrier on x86: `lock xadd`)
    pub(crate) fn atomic_fetch_add(&mut self, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.push(insn(STX | ATOMIC | Size::DW as u8, dst, src, off, 0x01))
    }

    /// `src = atomic_fetch_or((u64 *)(dst + off), src)` (fully ordered)
    pub(crate) fn atomic_fetch_or(&mut self, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.push(insn(STX | ATOMIC | Size::DW as u8, dst, src, off, 0x41))
    }

    /// `lock *(u64 *)(dst + off) |= src`
    pub(crate) fn atomic_or(&mut self, dst: Reg, off: i16, src: Reg) -> &mut Self {
        self.push(insn(STX | ATOMIC | Size::DW as u8, dst, src, off, 0x40))
    }

    /// `dst = -dst`
    pub(crate) fn neg(&mut self, dst: Reg) -> &mut Self {
        self.push(insn(ALU64 | 0x80, dst, 0, 0, 0))
    }

    /// `dst = map` (a `BPF_PSEUDO_MAP_FD` load, two instruction slots).
    pub(crate) fn load_map(&mut self, dst: Reg, map_fd: i32) -> &mut Self {
        self.push(insn(0x18, dst, 1, 0, map_fd));
        self.push(insn(0, 0, 0, 0, 0))
    }

    pub(crate) fn call(&mut self, helper: i32) -> &mut Self {
        self.push(insn(JMP | 0x80, 0, 0, 0, helper))
    }

    pub(crate) fn exit(&mut self) -> &mut Self {
        self.push(insn(JMP | 0x90, 0, 0, 0, 0))
    }

    fn jump_to(&mut self, i: Insn, l: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), l));
        self.push(i)
    }

    pub(crate) fn ja(&mut self, l: Label) -> &mut Self {
        self.jump_to(insn(JMP, 0, 0, 0, 0), l)
    }

    /// `if dst <op> imm goto l`
    pub(crate) fn jmp_imm(&mut self, op: Jmp, dst: Reg, imm: i32, l: Label) -> &mut Self {
        self.jump_to(insn(JMP | op as u8 | K, dst, 0, 0, imm), l)
    }

    /// `if dst <op> src goto l`
    pub(crate) fn jmp_reg(&mut self, op: Jmp, dst: Reg, src: Reg, l: Label) -> &mut Self {
        self.jump_to(insn(JMP | op as u8 | X, dst, src, 0, 0), l)
    }

    /// The finished program, with every jump resolved.
    ///
    /// # Panics
    /// On an unbound label or a jump out of range: both are bugs in the program generator.
    pub(crate) fn finish(mut self) -> Vec<Insn> {
        for &(at, l) in &self.fixups {
            let target = self.labels[l.0].expect("unbound label");
            let off = target as isize - (at as isize + 1);
            self.insns[at].off = i16::try_from(off).expect("jump out of range");
        }
        self.insns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_the_kernel_headers() {
        let mut a = Asm::default();
        let l = a.label();
        a.mov_imm(R0, 0); // BPF_MOV64_IMM(R0, 0) = b7 00 ...
        a.jmp_imm(Jmp::Eq, R1, 7, l); // 15 01 off imm
        a.load(Size::DW, R2, R1, 16); // 79 12 10 00
        a.atomic_add(R7, 8, R4); // db 47 08 00 00000000
        a.bind(l);
        a.exit(); // 95
        let p = a.finish();
        assert_eq!(
            p[0],
            Insn {
                code: 0xb7,
                regs: 0,
                off: 0,
                imm: 0
            }
        );
        assert_eq!(
            p[1],
            Insn {
                code: 0x15,
                regs: 1,
                off: 2,
                imm: 7
            }
        );
        assert_eq!(
            p[2],
            Insn {
                code: 0x79,
                regs: 0x12,
                off: 16,
                imm: 0
            }
        );
        assert_eq!(
            p[3],
            Insn {
                code: 0xdb,
                regs: 0x47,
                off: 8,
                imm: 0
            }
        );
        assert_eq!(p[4].code, 0x95);
    }
}
