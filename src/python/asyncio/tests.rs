use super::*;

fn task(id: u64, awaited_by: &[u64]) -> TaskInfo {
    TaskInfo {
        id,
        name: format!("t{id}"),
        numbered: false,
        running: false,
        stack: Vec::new(),
        awaiting: None,
        awaiting_id: None,
        awaited_by: awaited_by.to_vec(),
        awaits: Vec::new(),
        error: None,
    }
}

#[test]
fn links_a_diamond_and_finds_no_cycle() {
    // 1 awaits 2 and 3; both await 4.
    let mut t = vec![
        task(1, &[]),
        task(2, &[1]),
        task(3, &[1]),
        task(4, &[2, 3, 99]),
    ];
    assert!(link(&mut t).is_empty());
    assert_eq!(t[0].awaits, vec![2, 3]);
    assert_eq!(t[3].awaited_by, vec![2, 3], "99 is no task of the list");
    assert_eq!(t[1].awaits, vec![4]);
}

#[test]
fn reports_each_cycle_once() {
    // 1 → 2 → 3 → 1 and 4 → 4; 5 awaits into the cycle without being in it.
    let mut t = vec![
        task(1, &[3]),
        task(2, &[1]),
        task(3, &[2]),
        task(4, &[4]),
        task(5, &[]),
        task(6, &[5]),
    ];
    t[0].awaited_by.push(5);
    let mut c = link(&mut t);
    c.sort();
    assert_eq!(c, vec![vec![1, 2, 3], vec![4]]);
}

/// Bytes for [`fuzz_tasks`] (after the fuzz target's layout byte) holding a thread that
/// runs task B (`Task-7`), awaited by task A (`Task-5`), both on its list.
/// Where the fuzz target's memory lies (`fuzzing::STACK_BASE`).
const BASE: u64 = 0x5500_0000_0000;

fn two_task_graph() -> Vec<u8> {
    graph(false)
}

/// [`two_task_graph`]; with `by_set`, B's awaiters are a set holding A and, before it, a
/// deleted key's dummy (hash -1), as a set keeps one after a removal.
fn graph(by_set: bool) -> Vec<u8> {
    let base = BASE;
    // Offsets, as fuzz_tasks derives them from each byte (twice the byte, most of them
    // modulo 64): task of 168 bytes, name at 16, awaited_by 24, is_task 32, its set flag
    // 34, coro 40, list node 48; thread state: loop 16, running task 24, list head 32;
    // ob_type 8, tp_flags 16, tp_name 24; generator frame at 64, its state at 48.
    // A set: its used count at 16, mask at 24, table at 32.
    let mut head = [0u8; 26];
    for (i, v) in [52, 8, 12, 16, 17, 20, 24, 0, 8, 12, 16, 0, 4, 8, 12, 32, 24]
        .into_iter()
        .enumerate()
    {
        head[i] = v;
    }
    head[19..22].copy_from_slice(&[8, 12, 16]);
    head[24..26].copy_from_slice(&0x100u16.to_le_bytes());
    let mut mem = vec![0u8; 0x800];
    let mut put =
        |at: u64, v: u64| mem[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
    let (ts, a, b, int_type, n5, n7) = (0x100u64, 0x400u64, 0x600u64, 0x200, 0x280, 0x2c0);
    put(ts + 16, base + 0x10); // a running loop
    put(ts + 24, base + b); // running task B
    put(ts + 32, base + a + 48); // list: head → A → B → head
    put(a + 48, base + b + 48);
    put(b + 48, base + ts + 32);
    put(int_type + 16, 1 << 24); // an int type's tp_flags
    for (n, v) in [(n5, 5), (n7, 7)] {
        put(n + 8, base + int_type);
        put(n + 16, 1 << 3); // one digit
        put(n + 24, v);
    }
    put(a + 16, base + n5);
    put(b + 16, base + n7);
    if by_set {
        let (set, table) = (0x300u64, 0x340u64);
        put(set + 16, 1);
        put(set + 24, 3); // four slots
        put(set + 32, base + table);
        put(table, base + 0x380); // the dummy, below A's address
        put(table + 8, u64::MAX);
        put(table + 16, base + a);
        put(table + 24, 12345);
        put(b + 24, base + set);
        mem[b as usize + 34] = 1;
    } else {
        put(b + 24, base + a); // B awaited by A
    }
    mem[a as usize + 32] = 1;
    mem[b as usize + 32] = 1;
    let mut out = head.to_vec();
    out.extend(mem);
    out
}

fn fuzz_walker() -> StackWalker {
    let layout = crate::python_bindings::generated(3, 14, false).expect("3.14's table");
    StackWalker::new(*layout, super::super::strings::TypeAddrs::default())
}

#[test]
fn reads_a_running_task_and_its_awaiter_from_memory() {
    let base = BASE;
    let got = fuzz_tasks(&two_task_graph(), base, &mut fuzz_walker());
    let [all, running] = &got[..] else {
        panic!("two reads");
    };
    let names: Vec<&str> = all.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["Task-5", "Task-7"]);
    assert_eq!(all.running_task, Some(base + 0x600));
    assert_eq!(all.tasks[1].awaited_by, vec![base + 0x400]);
    assert_eq!(all.tasks[0].awaits, vec![base + 0x600]);
    let stack: Vec<String> = running
        .task_stack()
        .expect("a running task")
        .iter()
        .map(|f| f.function.to_string())
        .collect();
    assert_eq!(
        stack,
        ["task Task-*", "task Task-*"],
        "B, then A that awaits it"
    );
}

#[test]
fn a_deleted_key_of_an_awaiter_set_is_no_awaiter() {
    let got = fuzz_tasks(&graph(true), BASE, &mut fuzz_walker());
    let [all, running] = &got[..] else {
        panic!("two reads");
    };
    assert_eq!(all.tasks[1].awaited_by, vec![BASE + 0x400]);
    let ids: Vec<u64> = running.tasks.iter().map(|t| t.id).collect();
    assert_eq!(
        ids,
        [BASE + 0x600, BASE + 0x400],
        "B, then A: not the dummy"
    );
}

/// Writes the async_tasks fuzz target's seed (`cargo test --lib write_async_tasks_seed
/// -- --ignored`).
#[test]
#[ignore]
fn write_async_tasks_seed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/async_tasks");
    std::fs::create_dir_all(dir).unwrap();
    let mut seed = vec![0u8]; // 3.14's layout
    seed.extend(two_task_graph());
    std::fs::write(format!("{dir}/two_tasks"), seed).unwrap();
}

#[test]
fn says_which_versions_have_no_tasks_to_read() {
    assert!(unsupported((3, 10)).unwrap().contains("3.11 or later"));
    assert!(unsupported((2, 7)).is_some());
    assert!(unsupported((3, 11)).is_none());
    assert!(unsupported((3, 13)).is_none());
    assert!(unsupported((3, 14)).is_none());
    assert!(unsupported((3, 15)).is_none());
}

/// `.AsyncioDebug` and `_Py_DebugOffsets` are the target's memory and may hold any value at
/// all. An offset near `u64::MAX` is refused as outside its object, not summed past the top
/// (a panic with overflow checks).
#[test]
fn offsets_near_the_top_of_the_range_are_refused() {
    use crate::python_bindings::debug_offsets::{runtime_3_14_for_tests, set_3_14_field};
    let mut runtime = runtime_3_14_for_tests(crate::python::process::DEBUG_OFFSETS_READ);
    let layout = *crate::python_bindings::generated(3, 14, false).expect("3.14's table");
    let proc = PythonProcess::own_for_tests(layout, runtime.as_ptr() as u64);
    let mem = &proc.mem;
    // A task of 256 bytes, an interpreter state of 4096, a thread state of 1024.
    let good: [u64; 13] = [256, 16, 24, 32, 33, 40, 48, 4096, 64, 1024, 16, 24, 32];
    let section = |v: &[u64; 13]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    assert!(offsets(&proc, mem, &section(&good)).is_ok());
    for i in [1, 2, 5, 6, 8, 10, 11, 12] {
        let mut torn = good;
        torn[i] = u64::MAX - 3;
        assert!(offsets(&proc, mem, &section(&torn)).is_err(), "field {i}");
    }
    // `proc` reads `runtime` where it is, in place.
    set_3_14_field(&mut runtime, "interpreter_frame.stackpointer", u64::MAX - 3);
    let err = offsets(&proc, mem, &section(&good)).expect_err("a stack pointer past the frame");
    assert!(err.contains("stack pointer"), "{err}");
}
