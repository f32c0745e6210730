# libasync fiber commands for gdb (docs/DEBUGGING.md).
#
#   (gdb) source scripts/gdb/libasync-gdb.py
#   (gdb) info fibers              every fiber of every scheduler
#   (gdb) fiber bt <id|name>       backtrace of a fiber that is switched out
#
# The process must be stopped (a live process, attached or started under
# gdb). "fiber bt" points the selected thread's registers at the fiber's
# saved context (the frame la_ctx_switch left on the fiber's stack, see
# cabi/internal/fiber/switch_<arch>.S), runs "bt", and puts the registers
# back. It needs libasync's debug information (a normal build keeps it).
import struct

import gdb

STATES = {0: "new", 1: "runnable", 2: "running", 3: "parking", 4: "parked", 5: "notified", 6: "done-unjoined"}
WAITS = {
    0: "",
    1: "sleep",
    2: "join",
    3: "chan send",
    4: "chan recv",
    5: "select",
    6: "fd",
    7: "blocking call",
    8: "queue read",
    9: "queue write",
    10: "scope join",
}
LA_FS_RUNNING = 2
LA_FS_DONE = 6


def _scheds():
    try:
        s = gdb.parse_and_eval("la_dbg_sched_list")
    except gdb.error as e:
        raise gdb.GdbError("libasync: no scheduler list (is libasync loaded, with debug info?): %s" % e)
    while int(s) != 0:
        yield s
        s = s["dbg_next"]


def _fibers(s):
    nw = int(s["nw"])
    for i in range(nw + 1):
        lst = s["wks"][i]["fl"] if i < nw else s["fl"]
        f = lst["head"]
        while int(f) != 0:
            yield f
            f = f["all_next"]


def _name(f):
    try:
        return f["name"].string(length=-1).split("\0")[0]
    except gdb.error:
        return "?"


def _wait(f):
    what = int(f["wait_what"])
    obj = int(f["wait_obj"])
    w = WAITS.get(what, "?")
    if what == 2:
        w += " of fiber %d" % obj
    elif what in (3, 4, 8, 9, 10):
        w += " 0x%x" % obj
    elif what == 5:
        w += " of %d" % obj
    elif what == 6:
        dirs = obj >> 32
        w += " %d %s" % (obj & 0xFFFFFFFF, {1: "read", 2: "write", 3: "read+write"}.get(dirs, "?"))
    elif what == 7:
        w += " " + str(gdb.parse_and_eval("(void (*)(void *))%d" % obj))
    return w


class InfoFibers(gdb.Command):
    """List every libasync fiber: id, name, state, worker, what it waits on, saved stack pointer."""

    def __init__(self):
        super().__init__("info fibers", gdb.COMMAND_STATUS)

    def invoke(self, arg, from_tty):
        n = 0
        for s in _scheds():
            print("scheduler 0x%x (%d workers)" % (int(s["handle"]), int(s["nw"])))
            print("  %6s  %-20s  %-13s  %-6s  %-18s  %s" % ("id", "name", "state", "worker", "sp", "waits on"))
            for f in _fibers(s):
                st = int(f["state"])
                wk = f["wk"]
                widx = str(int(wk["idx"])) if int(wk) != 0 else "-"
                wait = _wait(f) if st in (3, 4) else ""
                print("  %6d  %-20s  %-13s  %-6s  0x%016x  %s"
                      % (int(f["id"]), '"%s"' % _name(f), STATES.get(st, "?"), widx, int(f["sp"]), wait))
                n += 1
        print("%d fibers" % n)


def _find(arg):
    arg = arg.strip()
    if not arg:
        raise gdb.GdbError("usage: fiber bt <id|name>")
    want_id = int(arg) if arg.isdigit() else None
    for s in _scheds():
        for f in _fibers(s):
            if (want_id is not None and int(f["id"]) == want_id) or (want_id is None and _name(f) == arg):
                return f
    raise gdb.GdbError("libasync: no fiber %s" % arg)


def _saved_regs(sp):
    """The registers la_ctx_switch saved at sp, as they are once it returns."""
    arch = gdb.selected_frame().architecture().name()
    inf = gdb.selected_inferior()
    if "x86-64" in arch:
        # [mxcsr|fpucw] r15 r14 r13 r12 rbx rbp ret
        w = struct.unpack("<8Q", bytes(inf.read_memory(sp, 64)))
        return [("r15", w[1]), ("r14", w[2]), ("r13", w[3]), ("r12", w[4]), ("rbx", w[5]), ("rbp", w[6]),
                ("rsp", sp + 64), ("pc", w[7])]
    if "aarch64" in arch:
        # x19..x30 at 0..95, d8..d15, fpcr; 176 bytes
        w = struct.unpack("<12Q", bytes(inf.read_memory(sp, 96)))
        regs = [("x%d" % (19 + i), w[i]) for i in range(10)]
        return regs + [("x29", w[10]), ("x30", w[11]), ("sp", sp + 176), ("pc", w[11])]
    raise gdb.GdbError("libasync: fiber bt supports x86-64 and aarch64, not %s" % arch)


class FiberPrefix(gdb.Command):
    """libasync fiber commands: fiber bt <id|name>."""

    def __init__(self):
        super().__init__("fiber", gdb.COMMAND_STACK, prefix=True)


class FiberBt(gdb.Command):
    """Backtrace of a switched-out libasync fiber: fiber bt <id|name> [bt arguments]."""

    def __init__(self):
        super().__init__("fiber bt", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        parts = arg.split(None, 1)
        f = _find(parts[0] if parts else "")
        extra = parts[1] if len(parts) > 1 else ""
        st = int(f["state"])
        if st == LA_FS_DONE:
            raise gdb.GdbError("libasync: fiber %d returned: no stack" % int(f["id"]))
        if st == LA_FS_RUNNING:
            raise gdb.GdbError("libasync: fiber %d runs on worker %d: select that worker's thread (info threads) "
                               "and use bt" % (int(f["id"]), int(f["wk"]["idx"])))
        regs = _saved_regs(int(f["sp"]))
        print('fiber %d "%s" (%s):' % (int(f["id"]), _name(f), STATES.get(st, "?")))
        if st in (3, 5):
            print("(parking: the fiber may still be on its worker's thread, switching out; this backtrace may be "
                  "from its previous switch)")
        gdb.execute("select-frame 0")
        saved = [(r, int(gdb.parse_and_eval("$" + r).cast(gdb.lookup_type("unsigned long")))) for r, _ in regs]
        try:
            for r, v in regs:
                gdb.execute("set $%s = %d" % (r, v))
            gdb.execute("bt " + extra)
        finally:
            for r, v in saved:
                gdb.execute("set $%s = %d" % (r, v))
            gdb.execute("select-frame 0")


InfoFibers()
FiberPrefix()
FiberBt()
