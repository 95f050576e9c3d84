# The trusted prelude of every sandbox process, passed to the interpreter with ``-c``.
#
# It runs before any untrusted input exists: in the "unshare" fallback it isolates the process
# itself (see _isolate); then it writes one ready byte on the control fd and blocks on stdin. The
# launcher starts these processes ahead of time, so interpreter start-up is off the hot path. Each
# process runs exactly one request, then exits: the request (a 10-digit length, then a marshal dump
# from the trusted launcher) carries the code, limits and files; whatever follows on stdin is the
# program's stdin. At the end the control fd carries frames (type byte, 10-digit length, payload):
# "E" the request's files could not be written (the message), "F" fetched files as JSON, then "X"
# the exit code (negative: killed by that signal), sent after stdout and stderr are flushed. The
# program can write to the control fd too, but can only spoil its own result that way. Only the
# standard library may be used here, and nothing from the host's Python environment: this file runs
# under the sandbox's interpreter.
#
# argv: -c MODE CONTROL_FD ROOT_MB TMP_MB SHM_MB [READ_ONLY_FOLDER...]
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
_MS_REC, _MS_PRIVATE, _MS_RELATIME = 16384, 1 << 18, 1 << 21
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
# The same view bubblewrap is given in launch.py (NOBODY, WORKDIR, ROOT_LINKS); this file cannot
# import it.
_NOBODY = 65534
_WORKDIR = "/sandbox"
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")


def _isolate(root_mb, tmp_mb, shm_mb, folders):
    """The fallback without bubblewrap, returning in the process that runs the code.

    The process the launcher started stays outside and mirrors the exit status of an init process
    (pid 1 of a new PID namespace: when it ends, everything in the sandbox ends). That init builds a
    fresh root on a size-capped tmpfs: /usr, the root links and the interpreter's folders read-only
    at their host paths, a private /proc, a minimal /dev, tmpfs on /tmp and /dev/shm, the working
    folder; it switches to it with pivot_root and drops the old root. The code then runs in its
    child, pid 2: uid 65534 when started as root (else the caller's uid in a user namespace), no
    capabilities, no new privileges; new network, IPC and UTS namespaces too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]

    def check(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(source, target, fstype, flags, data=None):
        check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                         data and data.encode()), f"mount {target}")

    def ro_bind(fd, target):
        mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        # Keep the flags the host mount has (a user namespace may not clear them), add read-only.
        flags = os.fstatvfs(fd).f_flag
        kept = flags & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
        if flags & 4096:  # ST_RELATIME
            kept |= _MS_RELATIME
        mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)

    check(libc.prctl(1, 9, 0, 0, 0), "pdeathsig")  # PR_SET_PDEATHSIG SIGKILL: gone with the launcher
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID
                       | (0 if root else _CLONE_NEWUSER)), "unshare")
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    init = os.fork()
    if init:  # outside: stand for the sandbox until its init ends
        code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        os._exit(code if code >= 0 else 128 - code)
    check(libc.prctl(1, 9, 0, 0, 0), "pdeathsig")  # gone with the outside process
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    owner, group = (_NOBODY, _NOBODY) if root else (uid, gid)
    # Opened before the new root hides them (a folder may be under /tmp); bound through the fds.
    binds, links = {"/usr": os.open("/usr", os.O_PATH)}, {}
    for name in _ROOT_LINKS:
        if os.path.islink(name):
            links[name] = os.readlink(name)
        elif os.path.isdir(name):
            binds[name] = os.open(name, os.O_PATH)
    for name in folders:
        binds[name] = os.open(name, os.O_PATH)
    new = "/tmp"  # any existing folder: the new root is mounted over it, in this namespace only
    mount("sandbox", new, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={root_mb}m,mode=0755,uid={owner},gid={group}")
    os.mkdir(new + "/proc")
    mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # this PID namespace only
    os.mkdir(new + "/dev")
    mount("dev", new + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        open(f"{new}/dev/{name}", "w").close()
        mount("/dev/" + name, f"{new}/dev/{name}", None, _MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    os.mkdir(new + "/dev/shm")
    mount("shm", new + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={shm_mb}m,mode=1777")
    mount(None, new + "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    os.mkdir(new + "/tmp")
    mount("tmp", new + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={tmp_mb}m,mode=1777")
    os.mkdir(new + _WORKDIR, 0o755)
    os.chown(new + _WORKDIR, owner, group)
    for name, fd in binds.items():  # after /tmp: a venv may live under it
        os.makedirs(new + name, exist_ok=True)
        ro_bind(fd, new + name)
        os.close(fd)
    for name, target in links.items():
        os.symlink(target, new + name)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: unsupported machine {os.uname().machine}")
    os.chdir(new)
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", _MNT_DETACH), "detach the old root")  # the host's root, stacked on ours
    os.chdir("/")
    worker = os.fork()
    if worker:  # pid 1: reap orphans until the code's process ends, then end the sandbox
        while True:
            pid, status = os.wait()
            if pid == worker:
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
    os.chdir(_WORKDIR)
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
    check(libc.prctl(1, 9, 0, 0, 0), "pdeathsig")  # a uid change resets it


def _read_exact(n):
    chunks = []
    while n:
        chunk = os.read(0, n)
        if not chunk:
            raise EOFError("the launcher closed stdin before a whole request arrived")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_files(files, control_fd):
    """The request's files, relative to the working folder or absolute (anywhere in the sandbox's
    own root). A file that cannot be written is the request's fault: reported, nothing runs."""
    for path, content in files.items():
        try:
            if not path:
                raise ValueError("empty file path")
            folder = os.path.dirname(path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
        except (OSError, ValueError) as exc:
            _send(control_fd, b"E", f"cannot write file {path!r}: {exc}".encode(errors="replace"))
            os._exit(1)


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
            with open(path, "rb") as f:
                data = f.read(max_bytes - total + 1)
        except (OSError, ValueError):  # absent, a folder, a NUL in the name...
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

        # The traceback module places its carets on the source lines minus their newline: the last
        # line needs one too.
        lines = (source if source.endswith("\n") else source + "\n").splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
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


def _fork():
    """``os.fork``, retried briefly on EAGAIN: under the unshare fallback RLIMIT_NPROC counts every
    process of uid 65534 on the host, and other sandboxes' processes may be on their way out."""
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8):
        try:
            return os.fork()
        except BlockingIOError:
            import time

            time.sleep(delay)
    return os.fork()


def _run_bash(request, control_fd):
    _set_limits(request["limits"])
    sys.stdout.flush()
    pid = _fork()
    if pid == 0:
        try:
            os.execv("/bin/bash", ["bash", "-c", request["code"], "main.sh"] + list(request["args"]))
        finally:
            os._exit(127)
    status = os.waitpid(pid, 0)[1]
    if request["fetch_files"]:
        _fetch_files(request["fetch_files"], control_fd, request["max_fetch_bytes"])
    _finish(os.waitstatus_to_exitcode(status), control_fd)  # -N when bash was killed by signal N


def _main():
    mode, control_fd = sys.argv[1], int(sys.argv[2])
    if mode == "unshare":
        _isolate(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:])
    os.write(control_fd, b"R")
    request = marshal.loads(_read_exact(int(_read_exact(10))))
    _write_files(request["files"], control_fd)
    if request["language"] == "bash":
        _run_bash(request, control_fd)
    else:
        _run_python(request, control_fd)


_main()
