;; The core module of the `several-memories` test component: it exports the functions of
;; `wasm-operator:plugin/reconciler@1.0.0` and one 40 MiB memory. build.rs turns it into a
;; component and adds a second core module, below, with another 40 MiB memory: each is under the
;; host's default 64 MiB cap, together they are over it.
;;
;; `cabi_realloc` is a bump allocator, so the host can pass `describe` its arguments; `describe`
;; and `render` trap, so a host that lets the component start gets an `unreachable` trap.
(module
  ;; 640 pages of 64 KiB: 40 MiB.
  (memory (export "memory") 640)
  (global $next (mut i32) (i32.const 1024))

  (func (export "cabi_realloc")
    (param $old i32) (param $old_size i32) (param $align i32) (param $new_size i32)
    (result i32)
    (local $at i32)
    ;; at = (next + align - 1) & -align; next = at + new_size
    (local.set $at
      (i32.and
        (i32.sub (i32.add (global.get $next) (local.get $align)) (i32.const 1))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $next (i32.add (local.get $at) (local.get $new_size)))
    (local.get $at))

  ;; describe(ctx: context) -> plugin-info: the context's two strings, a pointer to the result.
  (func (export "wasm-operator:plugin/reconciler@1.0.0#describe")
    (param i32 i32 i32 i32) (result i32)
    unreachable)

  ;; render(resource, ctx) -> result<...>: over 16 flat parameters, so one pointer to them.
  (func (export "wasm-operator:plugin/reconciler@1.0.0#render")
    (param i32) (result i32)
    unreachable)
)
