//! The BPF program, written as instructions (no BPF compiler at build time). It is a raw
//! tracepoint on `sched_switch` that, for each of the target's threads leaving or taking a
//! CPU, writes one [`Record`] to a ring buffer.
//!
//! Owns: the instruction encoding and the program.
//! Must not: load anything (see `sys`).

use super::btf::TaskOffsets;

/// One record as the program writes it (16 bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The thread's kernel id.
    pub(crate) tid: i32,
    /// True when it takes a CPU, false when it leaves one.
    pub(crate) switch_in: bool,
    /// Its total CPU time then (`se.sum_exec_runtime`, what schedstat shows).
    pub(crate) run_ns: u64,
}

pub(crate) const RECORD_LEN: usize = 16;

impl Record {
    pub(crate) fn parse(b: &[u8]) -> Option<Record> {
        let b: &[u8; RECORD_LEN] = b.get(..RECORD_LEN)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Some(Record {
            tid: u32_at(0) as i32,
            switch_in: u32_at(4) != 0,
            run_ns: u64_at(8),
        })
    }
}

/// One instruction: opcode, registers (dst low nibble, src high), offset, immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: dst | (src << 4),
            off,
            imm,
        }
    }

    /// The kernel's `struct bpf_insn`, little-endian.
    pub(crate) fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

// Registers.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const FP: u8 = 10;

// Opcodes (include/uapi/linux/bpf.h: class | op | source or size).
const MOV64_REG: u8 = 0x07 | 0xb0 | 0x08;
const MOV64_IMM: u8 = 0x07 | 0xb0;
const ADD64_IMM: u8 = 0x07;
const LDX_DW: u8 = 0x01 | 0x60 | 0x18;
const LDX_W: u8 = 0x01 | 0x60;
const ST_W: u8 = 0x02 | 0x60;
const ATOMIC_DW: u8 = 0x03 | 0xc0 | 0x18;
const JEQ_IMM: u8 = 0x05 | 0x10;
const JNE_IMM: u8 = 0x05 | 0x50;
const CALL: u8 = 0x05 | 0x80;
const EXIT: u8 = 0x05 | 0x90;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

// Helpers.
const MAP_LOOKUP_ELEM: i32 = 1;
const PROBE_READ_KERNEL: i32 = 113;
const RINGBUF_OUTPUT: i32 = 130;

/// Stack slots (below the frame pointer): the record at -16, scratch for the tgid at -32,
/// the drop counter's key at -40.
const REC: i16 = -16;
const TGID: i16 = -32;
const KEY: i16 = -40;

/// Instructions with forward jumps to the end of the current block.
struct Asm {
    code: Vec<Insn>,
    to_end: Vec<usize>,
}

impl Asm {
    fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.code.push(Insn::new(code, dst, src, off, imm));
    }

    fn call(&mut self, helper: i32) {
        self.op(CALL, 0, 0, 0, helper);
    }

    /// `if dst <code> imm goto end-of-block`.
    fn skip_if(&mut self, code: u8, dst: u8, imm: i32) {
        self.to_end.push(self.code.len());
        self.op(code, dst, 0, 0, imm);
    }

    fn end_block(&mut self) {
        let end = self.code.len();
        for at in self.to_end.drain(..) {
            self.code[at].off = (end - at - 1) as i16;
        }
    }

    fn map_fd(&mut self, dst: u8, fd: i32) {
        self.op(LD_IMM64, dst, PSEUDO_MAP_FD, 0, fd);
        self.op(0, 0, 0, 0, 0);
    }

    /// `bpf_probe_read_kernel(fp + slot, len, task + field)`; to the block's end on failure.
    fn read_field(&mut self, task: u8, field: u32, slot: i16, len: i32) {
        self.op(MOV64_REG, R1, FP, 0, 0);
        self.op(ADD64_IMM, R1, 0, 0, slot as i32);
        self.op(MOV64_IMM, R2, 0, 0, len);
        self.op(MOV64_REG, R3, task, 0, 0);
        self.op(ADD64_IMM, R3, 0, 0, field as i32);
        self.call(PROBE_READ_KERNEL);
        self.skip_if(JNE_IMM, R0, 0);
    }

    /// The record of one side of the switch (`task`: a register holding the task's
    /// address), when the task belongs to `tgid`.
    fn side(&mut self, task: u8, switch_in: bool, o: &TaskOffsets, tgid: i32, fds: (i32, i32)) {
        self.read_field(task, o.tgid, TGID, 4);
        self.op(LDX_W, R1, FP, TGID, 0);
        self.skip_if(JNE_IMM, R1, tgid);
        self.read_field(task, o.pid, REC, 4);
        self.read_field(task, o.sum_exec_runtime, REC + 8, 8);
        self.op(ST_W, FP, 0, REC + 4, switch_in as i32);
        self.map_fd(R1, fds.0);
        self.op(MOV64_REG, R2, FP, 0, 0);
        self.op(ADD64_IMM, R2, 0, 0, REC as i32);
        self.op(MOV64_IMM, R3, 0, 0, RECORD_LEN as i32);
        self.op(MOV64_IMM, R4, 0, 0, 0);
        self.call(RINGBUF_OUTPUT);
        self.skip_if(JEQ_IMM, R0, 0);
        // The ring was full, so count the lost record.
        self.op(ST_W, FP, 0, KEY, 0);
        self.map_fd(R1, fds.1);
        self.op(MOV64_REG, R2, FP, 0, 0);
        self.op(ADD64_IMM, R2, 0, 0, KEY as i32);
        self.call(MAP_LOOKUP_ELEM);
        self.skip_if(JEQ_IMM, R0, 0);
        self.op(MOV64_IMM, R1, 0, 0, 1);
        self.op(ATOMIC_DW, R0, R1, 0, 0); // BPF_ADD
        self.end_block();
    }
}

/// The program. `ring` is the ring buffer's map fd, `drops` a one-entry array of u64
/// counting records the full ring refused. Its context is the tracepoint's arguments
/// (`preempt, prev, next, ...`, each a u64).
pub(crate) fn switch_program(o: &TaskOffsets, tgid: i32, ring: i32, drops: i32) -> Vec<Insn> {
    let mut a = Asm {
        code: Vec::with_capacity(96),
        to_end: Vec::new(),
    };
    a.op(MOV64_REG, R6, R1, 0, 0);
    a.op(LDX_DW, R7, R6, 8, 0);
    a.side(R7, false, o, tgid, (ring, drops));
    a.op(LDX_DW, R7, R6, 16, 0);
    a.side(R7, true, o, tgid, (ring, drops));
    a.op(MOV64_IMM, R0, 0, 0, 0);
    a.op(EXIT, 0, 0, 0, 0);
    a.code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_instructions_as_the_kernel_reads_them() {
        // r1 = r10 (mov64 reg): 0xbf, dst 1, src 10.
        assert_eq!(
            Insn::new(MOV64_REG, R1, FP, 0, 0).to_bytes(),
            [0xbf, 0xa1, 0, 0, 0, 0, 0, 0]
        );
        // *(u32 *)(r10 - 20) = 1
        assert_eq!(
            Insn::new(ST_W, FP, 0, -20, 1).to_bytes(),
            [0x62, 0x0a, 0xec, 0xff, 1, 0, 0, 0]
        );
        assert_eq!(Insn::new(EXIT, 0, 0, 0, 0).to_bytes()[0], 0x95);
    }

    #[test]
    fn jumps_land_inside_the_program() {
        let o = TaskOffsets {
            pid: 100,
            tgid: 104,
            sum_exec_runtime: 200,
        };
        let p = switch_program(&o, 42, 3, 4);
        for (i, insn) in p.iter().enumerate() {
            if insn.code == JNE_IMM || insn.code == JEQ_IMM {
                let to = i as i64 + 1 + insn.off as i64;
                assert!(to > i as i64 && (to as usize) < p.len(), "{i}: {insn:?}");
            }
        }
        assert_eq!(p.last().unwrap().code, EXIT);
    }

    #[test]
    fn parses_records() {
        let mut b = [0u8; RECORD_LEN];
        b[0..4].copy_from_slice(&7i32.to_le_bytes());
        b[4] = 1;
        b[8..16].copy_from_slice(&9u64.to_le_bytes());
        let r = Record::parse(&b).unwrap();
        assert_eq!((r.tid, r.switch_in, r.run_ns), (7, true, 9));
        assert!(Record::parse(&b[..10]).is_none());
    }
}
