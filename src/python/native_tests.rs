//! The merge rule on stacks whose truth is known by construction (`native.rs`).

use super::*;
use crate::python::native_view::is_extension_module;
use std::sync::Arc;

/// A native frame named `name` (`?` for one no symbol covers) in module `lib`.
fn nf(name: &str, i: usize) -> NativeFrame {
    NativeFrame {
        address: 0x40_0000 + i as u64 * 16,
        symbol: (name != "?").then(|| Arc::from(name)),
        module: Some(Arc::from("lib.so")),
        offset: i as u64 * 16,
        file: None,
        line: None,
        function_start: None,
        module_note: None,
    }
}

/// Frame `i` occupies `[0x1000 + 0x100 i, 0x1000 + 0x100 (i + 1))` of a stack that ends at
/// 0x10000.
fn stack(names: &[&str]) -> NativeStack {
    NativeStack {
        frames: names.iter().enumerate().map(|(i, n)| nf(n, i)).collect(),
        sps: (0..names.len() as u64)
            .map(|i| 0x1000 + 0x100 * i)
            .collect(),
        stack_range: 0x1000..0x10000,
        truncated: false,
        stopped: None,
    }
}

/// An address inside native frame `i`'s locals.
fn inside(i: u64) -> u64 {
    0x1000 + 0x100 * i + 0x40
}

fn py(name: &str) -> Frame {
    Frame {
        function: name.into(),
        filename: "/app/x.py".into(),
        line: Some(1),
        native: false,
    }
}

/// The merged stack as words: Python frames as `py:NAME`, native ones by label.
fn words(m: &Merged) -> Vec<String> {
    m.stack
        .iter()
        .map(|e| match e {
            StackEntry::Python(f) => format!("py:{}", f.function),
            StackEntry::Native(f) => f.label(),
        })
        .collect()
}

const EVAL: &str = "_PyEval_EvalFrameDefault";

#[test]
fn up_to_3_10_each_eval_frame_becomes_its_python_frame() {
    let native = stack(&[
        "spin_inner",
        "cfunction_call",
        EVAL,
        "function_code_fastcall",
        EVAL,
        "PyEval_EvalCode",
        "main",
    ]);
    let frames = [py("caller"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(
        words(&m),
        [
            "spin_inner",
            "cfunction_call",
            "py:caller",
            "function_code_fastcall",
            "py:<module>",
            "PyEval_EvalCode",
            "main"
        ]
    );
    assert!(!m.truncated);
}

#[test]
fn python_2_7_has_its_own_loop_and_split_off_parts_count_as_the_function() {
    let native = stack(&["f", "PyEval_EvalFrameEx", "main"]);
    let frames = [py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    assert_eq!(
        words(&merge(&native, &side, 2).unwrap()),
        ["f", "py:<module>", "main"]
    );
    // On 3.x PyEval_EvalFrameEx is not the loop (3.6 keeps it as a thin wrapper).
    assert!(merge(&native, &side, 3).is_err());
    let cold = stack(&["f", "_PyEval_EvalFrameDefault.cold", "main"]);
    assert_eq!(
        words(&merge(&cold, &side, 3).unwrap()),
        ["f", "py:<module>", "main"]
    );
}

#[test]
fn counts_that_disagree_are_never_merged() {
    let native = stack(&["f", EVAL, "main"]);
    let frames = [py("caller"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    let why = merge(&native, &side, 3).unwrap_err().to_string();
    assert!(
        why.contains("1 evaluation-loop calls") && why.contains("2 in the Python"),
        "{why}"
    );
    // Stopped early, the error says so.
    let mut stopped = native.clone();
    stopped.stopped = Some("Could not read stack memory at 0x10".into());
    let why = merge(&stopped, &side, 3).unwrap_err().to_string();
    assert!(why.contains("stopped early"), "{why}");
    // Python frames outside any call (a 3.11+ walk whose outermost frame was not an entry).
    let one = [py("x")];
    let side = PythonSide {
        frames: &one,
        evals: &[],
        open: 1,
        truncated: false,
        anchors: None,
    };
    assert!(merge(&stack(&["main"]), &side, 3).is_err());
}

#[test]
fn tail_call_handlers_go_with_their_call() {
    let native = stack(&["deflate", "_TAIL_CALL_CALL_BUILTIN_O", EVAL, "main"]);
    let frames = [py("compress_it")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        ["deflate", "py:compress_it", "main"]
    );
}

/// A 3.14+ interpreter built with the tail-call interpreter (clang, `--with-tail-call-interp`).
/// `_PyEval_EvalFrameDefault` keeps the entry frame among its locals and calls the first
/// handler (`_TAIL_CALL_start_frame`), and each handler tail-calls the next. So one handler at
/// a time sits right above each call of the loop, the one running the current instruction.
#[test]
fn tail_call_handlers_go_with_the_call_whose_mark_their_caller_holds() {
    let native = stack(&[
        "deflate",
        "_TAIL_CALL_CALL_BUILTIN_O",
        EVAL,
        "_PyFunction_Vectorcall",
        "PyObject_Call",
        "_TAIL_CALL_CALL_FUNCTION_EX",
        EVAL,
        "PyEval_EvalCode",
        "main",
    ]);
    let frames = [py("compress_it"), py("helper"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[2, 1],
        open: 0,
        truncated: false,
        anchors: Some(&[inside(2), inside(6)]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        [
            "deflate",
            "py:compress_it",
            "py:helper",
            "_PyFunction_Vectorcall",
            "PyObject_Call",
            "py:<module>",
            "PyEval_EvalCode",
            "main"
        ]
    );
    // Running bytecode: the innermost frame is a handler (or one of the labels the
    // generator makes handlers of, `_TAIL_CALL_error`), which is the loop at work.
    for handler in ["_TAIL_CALL_BINARY_OP_ADD_INT", "_TAIL_CALL_error"] {
        let native = stack(&[handler, EVAL, "PyEval_EvalCode", "main"]);
        let frames = [py("<module>")];
        let side = PythonSide {
            frames: &frames,
            evals: &[1],
            open: 0,
            truncated: false,
            anchors: Some(&[inside(1)]),
        };
        assert_eq!(
            words(&merge(&native, &side, 3).unwrap()),
            ["py:<module>", "PyEval_EvalCode", "main"]
        );
    }
}

#[test]
fn a_tail_call_handler_is_hidden_only_right_above_a_call_of_the_loop() {
    // The innermost call is ending (its entry frame unlinked already, so no mark). Its
    // loop frame is shown as it is, and so is the handler running its last instruction.
    let native = stack(&[
        "_TAIL_CALL_INTERPRETER_EXIT",
        EVAL,
        "call",
        "_TAIL_CALL_CALL",
        EVAL,
        "main",
    ]);
    let frames = [py("f")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        open: 0,
        truncated: false,
        anchors: Some(&[inside(4)]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        ["_TAIL_CALL_INTERPRETER_EXIT", EVAL, "call", "py:f", "main"]
    );
    // A handler's name with no call of the loop right below it is a frame like any other.
    let native = stack(&["_TAIL_CALL_CALL", "call", EVAL, "main"]);
    let side = PythonSide {
        anchors: Some(&[inside(2)]),
        ..side
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        ["_TAIL_CALL_CALL", "call", "py:f", "main"]
    );
    // A handler holds no call's mark, so a mark found in one is not paired with it.
    let native = stack(&["_TAIL_CALL_CALL", EVAL, "main"]);
    let side = PythonSide {
        anchors: Some(&[inside(0)]),
        ..side
    };
    let why = merge(&native, &side, 3).unwrap_err().to_string();
    assert!(why.contains("_TAIL_CALL_CALL"), "{why}");
}

#[test]
fn from_3_11_calls_are_found_by_their_marks_on_the_c_stack_without_symbols() {
    // A stripped interpreter, where the loop's frames have no name.
    let native = stack(&["spin", "?", "?", "?", "?", "main"]);
    let frames = [py("inner"), py("caller"), py("<module>")];
    // Two calls: inner+caller run in frame 2, <module> in frame 4.
    let side = PythonSide {
        frames: &frames,
        evals: &[2, 1],
        open: 0,
        truncated: false,
        anchors: Some(&[inside(2), inside(4)]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        [
            "spin",
            "lib.so+0x10",
            "py:inner",
            "py:caller",
            "lib.so+0x30",
            "py:<module>",
            "main"
        ]
    );
    // A mark above the innermost frame's stack pointer, or in the outermost frame (whose
    // end is not known), means no merge.
    for bad in [[0x800, inside(4)], [inside(2), inside(5)]] {
        let side = PythonSide {
            anchors: Some(&bad),
            ..side
        };
        assert!(merge(&native, &side, 3).is_err(), "{bad:x?}");
    }
    // Two marks in one frame mean no merge.
    let side2 = PythonSide {
        anchors: Some(&[inside(2), inside(2) + 8]),
        ..side
    };
    assert!(merge(&native, &side2, 3).is_err());
    // A mark in a frame whose symbol is another function means no merge.
    let named = stack(&["spin", "?", "list_sort", "?", "?", "main"]);
    let why = merge(&named, &side, 3).unwrap_err().to_string();
    assert!(why.contains("list_sort"), "{why}");
    // More or fewer marks than calls mean no merge.
    let side3 = PythonSide {
        anchors: Some(&[inside(2)]),
        ..side
    };
    assert!(merge(&native, &side3, 3).is_err());
}

#[test]
fn the_3_15_sentinel_frame_in_the_thread_state_is_no_call() {
    let native = stack(&["spin", "?", "PyEval_EvalCode", "main"]);
    let frames = [py("caller"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[2, 0],
        open: 0,
        truncated: false,
        // The second mark is the thread state's base frame, off the C stack.
        anchors: Some(&[inside(1), 0x7f00_0000]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        [
            "spin",
            "py:caller",
            "py:<module>",
            "PyEval_EvalCode",
            "main"
        ]
    );
    // On the stack, the same empty call is a call, and wants its own frame.
    let side = PythonSide {
        anchors: Some(&[inside(1), inside(3)]),
        ..side
    };
    assert!(merge(&native, &side, 3).is_err());
}

#[test]
fn a_python_stack_cut_at_its_depth_limit_merges_as_far_as_it_goes() {
    let native = stack(&["c", EVAL, "call", EVAL, "call", EVAL, "main"]);
    let frames = [py("f1"), py("f2")];
    // Cut inside the second call (found by symbol), the stack has its frames, then the cut.
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        open: 1,
        truncated: true,
        anchors: None,
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(words(&m), ["c", "py:f1", "call", "py:f2"]);
    assert!(m.truncated);
    // By marks, only complete calls are known, and the stack ends with the last one (f2's
    // call, with the C frames before it, is past the cut).
    let anchored = stack(&["c", "?", "call", "?", "call", "?", "main"]);
    let side = PythonSide {
        anchors: Some(&[inside(1)]),
        ..side
    };
    let m = merge(&anchored, &side, 3).unwrap();
    assert_eq!(words(&m), ["c", "py:f1"]);
    assert!(m.truncated);
}

#[test]
fn a_native_stack_cut_at_its_depth_limit_merges_as_far_as_it_goes() {
    // Three calls of the loop, the native stack cut inside the third (its frame not
    // unwound). The two innermost calls merge, and the stack ends with the last frame
    // unwound.
    let mut native = stack(&["c", EVAL, "call", EVAL, "call"]);
    native.truncated = true;
    let frames = [py("f1"), py("f2"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1, 1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(words(&m), ["c", "py:f1", "call", "py:f2", "call"]);
    assert!(m.truncated);
    // By marks, the third lies past the outermost frame unwound (or in it, whose end is
    // not known), and the result is the same.
    let mut anchored = stack(&["c", "?", "call", "?", "call"]);
    anchored.truncated = true;
    for third in [inside(4), inside(9)] {
        let side = PythonSide {
            anchors: Some(&[inside(1), inside(3), third]),
            ..side
        };
        let m = merge(&anchored, &side, 3).unwrap();
        assert_eq!(
            words(&m),
            ["c", "py:f1", "call", "py:f2", "call"],
            "{third:#x}"
        );
        assert!(m.truncated);
    }
    // Both cut, the native stack first. It decides where the merged stack ends (the
    // Python frames of the call cut off part way have no place).
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1],
        open: 1,
        truncated: true,
        anchors: None,
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(words(&m), ["c", "py:f1", "call", "py:f2", "call"]);
    // Not cut, the same frames do not pair up, so they are never merged.
    native.truncated = false;
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1, 1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    assert!(merge(&native, &side, 3).is_err());
    anchored.truncated = false;
    let side = PythonSide {
        anchors: Some(&[inside(1), inside(3), inside(9)]),
        ..side
    };
    assert!(merge(&anchored, &side, 3).is_err());
}

#[test]
fn only_the_innermost_call_of_the_loop_may_have_no_python_frame_yet() {
    // Up to 3.10, by symbol, with one loop frame more than Python frames, the innermost one,
    // starting (or ending) its call, is shown as it is.
    let native = stack(&[EVAL, "call", EVAL, "main"]);
    let frames = [py("f1")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        open: 0,
        truncated: false,
        anchors: None,
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(words(&m), [EVAL, "call", "py:f1", "main"]);
    // By mark, the same holds, the innermost loop frame holding no mark.
    let native = stack(&["spin", EVAL, "call", EVAL, "main"]);
    let side = PythonSide {
        anchors: Some(&[inside(3)]),
        ..side
    };
    let m = merge(&native, &side, 3).unwrap();
    assert_eq!(words(&m), ["spin", EVAL, "call", "py:f1", "main"]);
    // Loop frames further out with no mark mean the Python stack was read in a moment when
    // it did not show them (3.12's new `_PyCFrame` linked before its frame is). Such a stack
    // is never merged, however few Python frames there are.
    let native = stack(&[EVAL, "call", EVAL, "call", EVAL, "main"]);
    let side = PythonSide {
        frames: &[],
        evals: &[],
        open: 0,
        truncated: false,
        anchors: Some(&[]),
    };
    let why = merge(&native, &side, 3).unwrap_err().to_string();
    assert!(why.contains("3 frames of the evaluation loop"), "{why}");
    let frames = [py("f1")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1],
        anchors: Some(&[inside(4)]),
        ..side
    };
    assert!(merge(&native, &side, 3).is_err());
}

#[test]
fn a_3_11_call_caught_before_it_links_its_first_frame_merges() {
    // The innermost call of the loop (frame 1) has pushed its `_PyCFrame` (a mark) but not
    // linked a Python frame. So there are three marks and two calls with frames.
    let native = stack(&["callee", EVAL, "call", EVAL, "call", EVAL, "main"]);
    let frames = [py("f"), py("<module>")];
    let side = PythonSide {
        frames: &frames,
        evals: &[1, 1],
        open: 0,
        truncated: false,
        anchors: Some(&[inside(1), inside(3), inside(5)]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        [
            "callee",
            EVAL,
            "call",
            "py:f",
            "call",
            "py:<module>",
            "main"
        ]
    );
    // With the extra mark not inner to the others' frames (or outside the stack), nothing
    // is guessed.
    let side = PythonSide {
        anchors: Some(&[inside(5), inside(3), inside(1)]),
        ..side
    };
    assert!(merge(&native, &side, 3).is_err());
    let side = PythonSide {
        anchors: Some(&[0x20000, inside(3), inside(5)]),
        ..side
    };
    assert!(merge(&native, &side, 3).is_err());
}

#[test]
fn a_3_11_first_call_caught_before_it_links_its_first_frame_merges() {
    // A main thread entering its module: the one call of the loop has pushed its
    // `_PyCFrame` (the only mark) and linked no Python frame yet (seen once in ~4,000
    // samples on pyenv's 3.11.7).
    let native = stack(&[EVAL, "PyEval_EvalCode", "run_mod", "main"]);
    let side = PythonSide {
        frames: &[],
        evals: &[],
        open: 0,
        truncated: false,
        anchors: Some(&[inside(0)]),
    };
    assert_eq!(
        words(&merge(&native, &side, 3).unwrap()),
        [EVAL, "PyEval_EvalCode", "run_mod", "main"]
    );
    // With the mark outside the thread's stack, or a Python frame outside any call, nothing
    // is guessed.
    let off = PythonSide {
        anchors: Some(&[0x20000]),
        ..side
    };
    assert!(merge(&native, &off, 3).is_err());
    let frames = [py("<module>")];
    let open = PythonSide {
        frames: &frames,
        open: 1,
        ..side
    };
    assert!(merge(&native, &open, 3).is_err());
}

/// With `--native`, a sample is native time when a native frame above its innermost Python
/// frame is an extension's or a library's (BLAS under `a @ a`, which is no call), not when
/// only the interpreter's own code or the C library is there.
#[test]
fn extension_code_above_the_innermost_python_frame_is_native_time() {
    let at = |name: &str, module: &str| {
        let mut f = nf(name, 0);
        f.module = Some(Arc::from(module));
        StackEntry::Native(f)
    };
    let view = |stack: Vec<StackEntry>| NativeView {
        merged: true,
        stack,
        ..NativeView::default()
    };
    let blas = view(vec![
        at("dgemm_kernel", "libscipy_openblas64_-32a4b2a6.so"),
        at(
            "DOUBLE_matmul",
            "_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
        ),
        at("PyNumber_MatrixMultiply", "libpython3.11.so.1.0"),
        StackEntry::Python(py("main")),
        at("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"),
    ]);
    assert_eq!(blas.runs_extension_code(), Some(true));
    let interpreter = view(vec![
        at("memcpy", "libc.so.6"),
        at("_PyObject_Malloc", "libpython3.11.so.1.0"),
        at("_PyEval_EvalFrameDefault", "python3.11"),
        StackEntry::Python(py("main")),
        // An extension below the Python frame called it, and is not what runs now.
        at("call_back", "ext.so"),
    ]);
    assert_eq!(interpreter.runs_extension_code(), None);
    let mut unmerged = blas.clone();
    unmerged.merged = false;
    assert_eq!(unmerged.runs_extension_code(), None);
    // With no Python frame at all, there is nothing to charge.
    assert_eq!(
        view(vec![at("worker", "ext.so")]).runs_extension_code(),
        None
    );
    for own in [
        "libc.so.6",
        "ld-linux-x86-64.so.2",
        "libm.so.6",
        "python3.12",
        "[vdso]",
    ] {
        assert!(!is_extension_module(own), "{own}");
    }
    assert!(is_extension_module("zlib.cpython-312-x86_64-linux-gnu.so"));
    assert!(is_extension_module("libz.so.1"));
}
