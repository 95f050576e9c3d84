# The trusted prelude of every sandbox process, passed to the interpreter with ``-c``.
#
# It runs before any untrusted input exists: in the "unshare" fallback it isolates the process
# itself (namespaces, read-only mounts, a private tmpfs, dropping to uid 65534); then it writes one
# ready byte on the control fd and blocks on stdin. The launcher starts these processes ahead of
# time, so interpreter start-up is off the hot path. Each process runs exactly one request, then
# exits: the request (a 10-digit length, then a marshal dump from the trusted launcher) carries the
# code, limits and files; whatever
# follows on stdin is the program's stdin. At the end the control fd carries frames (type byte,
# 10-digit length, payload): "F" fetched files as JSON, then "X" the exit code, sent after stdout
# and stderr are flushed. The program can write to the control fd too, but can only spoil its own
# result that way. Only the standard library may be used here, and nothing from the host's Python
# environment: this file runs under the sandbox's interpreter.
#
# argv: -c MODE CONTROL_FD WORKDIR_MB SHM_MB
# ruff: noqa: SIM105 -- contextlib.suppress would cost an import in every sandbox process
#
# Imports cost CPU in every sandbox process, so only built-in modules are imported up front; what
# only some runs need (tracebacks, JSON for fetched files, ctypes for the fallback) is imported then.
import atexit
import binascii
import builtins
import gc
import marshal
import os
import resource
import sys

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_KEPT_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
               "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_NOBODY = 65534


def _isolate(workdir_mb, shm_mb):
    """The fallback without bubblewrap: own network, mount, IPC and UTS namespaces; every inherited
    mount read-only; size-capped tmpfs on /tmp (the working folder) and /dev/shm; uid 65534 when
    started as root, else a user namespace with all capabilities dropped."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def check(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
                       | (0 if root else _CLONE_NEWUSER)), "unshare")
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        # \040 and friends escape spaces in mount points.
        point = fields[4].encode().decode("unicode_escape").encode("latin-1")
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for opt in fields[5].split(","):
            flags |= _KEPT_FLAGS.get(opt, 0)
        ret = libc.mount(None, point, None, flags, None)
        if point == b"/":
            check(ret, "remount / read-only")
    owner = _NOBODY if root else uid
    opts = f"size={workdir_mb}m,mode=0700,uid={owner},gid={_NOBODY if root else gid}"
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()), "mount /tmp")
    if os.path.isdir("/dev/shm"):
        opts = f"size={shm_mb}m,mode=1777"
        check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()), "mount /dev/shm")
    os.chdir("/tmp")
    if root:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)  # clears every capability
    else:
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "drop capabilities")
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    check(libc.prctl(1, 9, 0, 0, 0), "pdeathsig")  # PR_SET_PDEATHSIG SIGKILL; a uid change resets it


def _read_exact(n):
    chunks = []
    while n:
        chunk = os.read(0, n)
        if not chunk:
            raise EOFError("the launcher closed stdin before a whole request arrived")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _safe_path(path):
    if os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        raise ValueError(f"file path {path!r} must be relative and stay inside the working folder")
    return path


def _write_files(files):
    for path, content in files.items():
        path = _safe_path(path)
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "wb") as f:
            f.write(binascii.a2b_base64(content or ""))


def _send(control_fd, kind, payload):
    """One control frame: a type byte, a 10-digit length, the payload."""
    data = kind + b"%010d" % len(payload) + payload
    try:
        while data:
            data = data[os.write(control_fd, data):]
    except OSError:
        pass  # the program closed or broke the fd: the launcher falls back to the exit status


def _fetch_files(paths, control_fd, max_bytes):
    import json  # JSON, not marshal: the launcher must never unmarshal what the program could forge

    found, total = {}, 0
    for path in paths:
        try:
            with open(_safe_path(path), "rb") as f:
                data = f.read(max_bytes - total + 1)
        except (OSError, ValueError):
            continue
        total += len(data)
        if total > max_bytes:
            break
        found[path] = binascii.b2a_base64(data, newline=False).decode()
    _send(control_fd, b"F", json.dumps(found).encode())


def _finish(code, control_fd):
    """Report the exit code once all output is in the pipes, then exit without interpreter teardown:
    the launcher answers as soon as it reads the report, and teardown (~10 ms) is off its path."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _send(control_fd, b"X", b"%d" % code)
    os._exit(code)


def _exit_code(exc):
    """The status ``sys.exit(code)`` gives, as the interpreter computes it."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        print(exc.code, file=sys.stderr)
    except (OSError, ValueError):
        pass
    return 1


def _set_limits(limits):
    for name, (soft, hard) in limits.items():
        which = getattr(resource, "RLIMIT_" + name)
        cur_hard = resource.getrlimit(which)[1]
        if cur_hard != resource.RLIM_INFINITY:  # only ever lower a limit
            hard = cur_hard if hard < 0 else min(hard, cur_hard)
            soft = hard if soft < 0 else min(soft, hard)
        resource.setrlimit(which, (resource.RLIM_INFINITY if soft < 0 else soft,
                                   resource.RLIM_INFINITY if hard < 0 else hard))


def _run_python(request, control_fd):
    source, filename = request["code"], "main.py"
    main = type(sys)("__main__")
    main.__file__ = filename
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [filename] + list(request["args"])
    sys.path.insert(0, os.getcwd())
    sys.stdout.reconfigure(line_buffering=True)  # output printed before a kill still arrives
    if request["fetch_files"]:
        def fetch():
            # Drop the program's objects first so files it left open are flushed and closed.
            main.__dict__.clear()
            gc.collect()
            _fetch_files(request["fetch_files"], control_fd, request["max_fetch_bytes"])

        atexit.register(fetch)  # registered first, so it runs after the program's own exit hooks
    _set_limits(request["limits"])
    code = 0
    try:
        exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        # Print it the way the interpreter would, without this frame (a SyntaxError has no frame).
        # The traceback module (unlike the built-in printer) reads source lines from linecache,
        # where the source is registered so no file has to be written.
        import linecache
        import traceback

        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tb = exc.__traceback__
        exc.__traceback__ = tb.tb_next if tb is not None else None
        if sys.excepthook is sys.__excepthook__:
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        else:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    # What the interpreter's shutdown would do that a program can observe: wait for its
    # non-daemon threads, then run its exit hooks (and the file fetch, registered first).
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = code or 1
    _finish(code, control_fd)


def _run_bash(request, control_fd):
    _set_limits(request["limits"])
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/bash", ["bash", "-c", request["code"], "main.sh"] + list(request["args"]))
        finally:
            os._exit(127)
    status = os.waitpid(pid, 0)[1]
    if request["fetch_files"]:
        _fetch_files(request["fetch_files"], control_fd, request["max_fetch_bytes"])
    _finish(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status), control_fd)


def _main():
    mode, control_fd, workdir_mb, shm_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if mode == "unshare":
        _isolate(workdir_mb, shm_mb)
    os.write(control_fd, b"R")
    request = marshal.loads(_read_exact(int(_read_exact(10))))
    _write_files(request["files"])
    if request["language"] == "bash":
        _run_bash(request, control_fd)
    else:
        _run_python(request, control_fd)


_main()
