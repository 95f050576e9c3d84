# The trusted prelude of every sandbox process, passed to the interpreter with ``-c``.
#
# It runs before any untrusted input exists: in the "unshare" fallback it isolates the process
# itself (see _isolate); in both modes it furnishes the root alike (_furnish); then it writes one
# ready byte on the control fd and blocks on stdin. The launcher starts these processes ahead of
# time, so interpreter start-up is off the hot path. Each process runs exactly one request, then
# exits: the request (a 10-digit length, then a marshal dump from the trusted launcher) carries the
# code, limits and files; whatever follows on stdin is the program's stdin. At the end the control
# fd carries frames (type byte, 10-digit length, payload): "E" the request's files could not be
# written (the message), "C" a compile step's result as JSON (sent when it ends, before the program
# runs), "F" fetched files as JSON, then "X" the exit code (negative: killed by that signal), sent
# after stdout and stderr are flushed. A program run in this interpreter can write to the control fd
# too, but can only spoil its own result that way; commands (compilers, other languages) never get
# it. Only the standard library may be used here, and nothing from the host's Python environment:
# this file runs under the sandbox's interpreter.
#
# argv: -c MODE CONTROL_FD ROOT_MB TMP_MB SHM_MB N [SOURCE TARGET]*N [NAME=EXECUTABLE...]
#   N read-only mounts (host source -> path in the sandbox; the fallback makes them, bubblewrap
#   already has), then the commands to link in /run/toolrl/bin
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
_HOSTNAME = "sandbox"
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")  # bubblewrap's --dev set
# As languages.py: the commands' folder and where this process's pytest may be mounted.
_BIN = "/run/toolrl/bin"
_PYTEST_DIR = "/run/toolrl/pytest"
# The usual top-level folders of SandboxFusion's host, so code may write /mnt/x or /opt/y as there.
_FOLDERS = ("/etc", "/home", "/media", "/mnt", "/opt", "/srv", "/var/tmp", _BIN)


class _Libc:
    """The few system calls the fallback needs, through ctypes (imported only in that mode)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = lib = ctypes.CDLL(None, use_errno=True)
        lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]
        lib.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

    def check(self, ret, what):
        if ret != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source, target, fstype, flags, data=None):
        self.check(self.lib.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                                  data and data.encode()), f"mount {target}")

    def ro_bind(self, fd, target):
        self.mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        # Keep the flags the host mount has (a user namespace may not clear them), add read-only,
        # nosuid and nodev (as bubblewrap's binds).
        flags = os.fstatvfs(fd).f_flag
        kept = flags & (_MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
        if flags & 4096:  # ST_RELATIME
            kept |= _MS_RELATIME
        self.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)

    def prctl(self, option, arg, what):
        self.check(self.lib.prctl(option, arg, 0, 0, 0), what)

    def loopback_up(self):
        """``ip link set lo up`` (SIOCSIFFLAGS), as bubblewrap does in its network namespace: code can
        serve and connect on 127.0.0.1 and ::1, and nothing beyond."""
        ctypes = self.ctypes
        fd = self.lib.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM
        if fd < 0:
            self.check(-1, "socket")
        try:
            ifreq = ctypes.create_string_buffer(b"lo", 40)  # struct ifreq: name[16], then the flags
            ctypes.c_short.from_buffer(ifreq, 16).value = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
            self.check(self.lib.ioctl(fd, 0x8914, ifreq), "bring up the loopback")  # SIOCSIFFLAGS
        finally:
            os.close(fd)


def _isolate(root_mb, tmp_mb, shm_mb, mounts):
    """The fallback without bubblewrap, returning in the process that runs the code.

    The process the launcher started stays outside and mirrors the exit status of an init process
    (pid 1 of a new PID namespace: when it ends, everything in the sandbox ends). That init builds a
    fresh root (_build_root) and switches to it with pivot_root, dropping the old root. The code then
    runs in its child, pid 2: uid 65534 when started as root (else the caller's uid in a user
    namespace), no capabilities, no new privileges; new network (loopback up), IPC and UTS namespaces
    too, the host name bubblewrap sets."""
    libc = _Libc()
    libc.prctl(1, 9, "pdeathsig")  # PR_SET_PDEATHSIG SIGKILL: gone with the launcher
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    libc.check(libc.lib.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID
                                | (0 if root else _CLONE_NEWUSER)), "unshare")
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    libc.loopback_up()
    libc.check(libc.lib.sethostname(_HOSTNAME.encode(), len(_HOSTNAME)), "sethostname")
    init = os.fork()
    if init:  # outside: stand for the sandbox until its init ends
        code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        os._exit(code if code >= 0 else 128 - code)
    libc.prctl(1, 9, "pdeathsig")  # gone with the outside process
    _build_root(libc, (_NOBODY, _NOBODY) if root else (uid, gid), root_mb, tmp_mb, shm_mb, mounts)
    worker = os.fork()
    if worker:  # pid 1: reap orphans until the code's process ends, then end the sandbox
        while True:
            pid, status = os.wait()
            if pid == worker:
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
    os.chdir(_WORKDIR)
    _drop_privileges(libc, root)


def _build_root(libc, owner, root_mb, tmp_mb, shm_mb, mounts):
    """The root bubblewrap builds (launch.py): a size-capped tmpfs; /usr, the root links and the
    read-only mounts at their targets; a private /proc; bubblewrap's minimal /dev; tmpfs on /tmp
    and /dev/shm; the working folder. Folders made for mounts belong to the sandbox's user, as
    bubblewrap's do."""
    mount = libc.mount
    # Opened before the new root hides them (a source may be under /tmp); bound through the fds.
    binds, links = [("/usr", os.open("/usr", os.O_PATH))], {}
    for name in _ROOT_LINKS:
        if os.path.islink(name):
            links[name] = os.readlink(name)
        elif os.path.isdir(name):
            binds.append((name, os.open(name, os.O_PATH)))
    binds += [(target, os.open(source, os.O_PATH)) for source, target in mounts]
    new = "/tmp"  # any existing folder: the new root is mounted over it, in this namespace only
    uid, gid = owner
    mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={root_mb}m,mode=0755,uid={uid},gid={gid}")
    os.mkdir(new + "/proc")
    mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # this PID namespace only
    os.mkdir(new + "/dev")
    mount("tmpfs", new + "/dev", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size=64k,mode=0755,uid={uid},gid={gid}")
    for name in _DEVICES:
        open(f"{new}/dev/{name}", "w").close()
        mount("/dev/" + name, f"{new}/dev/{name}", None, _MS_BIND)
        mount(None, f"{new}/dev/{name}", None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{new}/dev/{name}")
    os.mkdir(new + "/dev/pts")
    mount("devpts", new + "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    os.mkdir(new + "/dev/shm")
    mount("tmpfs", new + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={shm_mb}m,mode=0755,uid={uid},gid={gid}")
    mount(None, new + "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.mkdir(new + "/tmp")
    mount("tmpfs", new + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={tmp_mb}m,mode=0755,uid={uid},gid={gid}")
    os.mkdir(new + _WORKDIR, 0o755)
    os.chown(new + _WORKDIR, uid, gid)
    for target, fd in binds:  # after /tmp: a source may live under it
        _make_target(new, target, os.fstat(fd).st_mode & 0o170000 == 0o040000, owner)  # S_ISDIR
        libc.ro_bind(fd, new + target)
        os.close(fd)
    for name, target in links.items():
        os.symlink(target, new + name)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: unsupported machine {os.uname().machine}")
    os.chdir(new)
    libc.check(libc.lib.syscall(number, b".", b"."), "pivot_root")
    libc.check(libc.lib.umount2(b".", _MNT_DETACH), "detach the old root")  # the host's root, stacked on ours
    os.chdir("/")


def _make_target(new, target, is_dir, owner):
    """A mount point under the new root, its missing parents made as the sandbox's user owns them."""
    parts = target.strip("/").split("/")
    path = new
    for i, part in enumerate(parts):
        path += "/" + part
        if os.path.lexists(path):
            continue
        if i < len(parts) - 1 or is_dir:
            os.mkdir(path, 0o755)
        else:
            open(path, "w").close()
        os.chown(path, *owner)


def _drop_privileges(libc, root):
    """As root: uid 65534 (setuid clears every capability), then, where unprivileged user namespaces
    are allowed, a user namespace of its own mapping just that uid, as bubblewrap's: the process limit
    then counts per sandbox, not for every uid-65534 process of the host, and host files show the
    owners bubblewrap shows. Not root: already in a user namespace. Then every capability dropped,
    the bounding set emptied (bubblewrap's --cap-drop ALL), no new privileges."""
    _empty_bounding_set(libc)
    if root:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
        try:
            libc.check(libc.lib.unshare(_CLONE_NEWUSER), "unshare the user namespace")
        except OSError:
            pass  # not allowed here: the host-wide process limit it is
        else:
            # The uid change made this process non-dumpable, which makes /proc/self root's; an exec
            # would undo it anyway.
            libc.prctl(4, 1, "dumpable")  # PR_SET_DUMPABLE
            for name, text in (("setgroups", "deny"), ("uid_map", f"{_NOBODY} {_NOBODY} 1"),
                               ("gid_map", f"{_NOBODY} {_NOBODY} 1")):
                with open("/proc/self/" + name, "w") as f:
                    f.write(text)
            _empty_bounding_set(libc)  # a new user namespace starts with every capability
    ctypes = libc.ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc.check(libc.lib.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "drop capabilities")
    libc.prctl(38, 1, "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    libc.prctl(1, 9, "pdeathsig")  # a uid change resets it


def _empty_bounding_set(libc):
    cap = 0
    while libc.lib.prctl(24, cap, 0, 0, 0) == 0:  # PR_CAPBSET_DROP until the kernel knows no more
        cap += 1


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


def _spawn(argv, env, limits, stdio=None):
    """A command as a child of this process (never given the control fd): its own limits, the
    program's stdin unless ``stdio`` (stdin, stdout, stderr fds) says otherwise."""
    sys.stdout.flush()
    pid = _fork()
    if pid == 0:
        try:
            if stdio is not None:
                for target, fd in enumerate(stdio):
                    os.dup2(fd, target)
            _set_limits(limits)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            try:
                os.write(2, f"{argv[0]}: {exc}\n".encode(errors="replace"))
            finally:
                os._exit(127)
    return pid


def _compile(request, env, control_fd):
    """The compile step, its output captured apart from the program's (SandboxFusion's
    compile_result) and sent as a "C" frame; returns its exit code."""
    import json
    import select

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY)
    pid = _spawn(request["compile"], env, request["compile_limits"], (null, out_w, err_w))
    for fd in (null, out_w, err_w):
        os.close(fd)
    captured, room = {out_r: [], err_r: []}, {out_r: request["max_output_bytes"], err_r: request["max_output_bytes"]}
    poller = select.poll()
    for fd in captured:
        poller.register(fd, select.POLLIN)
    open_fds = set(captured)
    while open_fds:
        for fd, _ in poller.poll():
            data = os.read(fd, 65536)
            if not data:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif room[fd] > 0:
                captured[fd].append(data[:room[fd]])
                room[fd] -= len(data)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    report = {"return_code": code}
    for name, fd in (("stdout", out_r), ("stderr", err_r)):
        report[name] = binascii.b2a_base64(b"".join(captured[fd]), newline=False).decode()
        os.close(fd)
    _send(control_fd, b"C", json.dumps(report).encode())
    return code


def _run_command(request, control_fd):
    """Every language but python: the code as a file, compiled when the language is, then run."""
    env = {**os.environ, **request["env"]}
    code = 0
    if request["compile"]:
        code = _compile(request, env, control_fd)
    if code == 0:
        status = os.waitpid(_spawn(request["run"], env, request["limits"]), 0)[1]
        code = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
    if request["fetch_files"]:
        _fetch_files(request["fetch_files"], control_fd, request["max_fetch_bytes"])
    _finish(code, control_fd)


_PYTEST = """#!/bin/sh
exec '{python}' -c 'import sys; sys.path.append("{folder}"); import pytest; sys.exit(pytest.main())' "$@"
"""


def _furnish(targets, commands):
    """What both modes add to the root, made by the sandbox's own user: the usual top-level folders,
    a minimal /etc (localhost and the host name resolve, the user has a name), and in /run/toolrl/bin
    python (this interpreter), pytest (its own, else the one mounted in /run/toolrl/pytest) and the
    toolchains' commands."""
    for folder in _FOLDERS:
        os.makedirs(folder, 0o755, exist_ok=True)
    for target in targets:  # the folders made for mounts: bubblewrap makes them 0700
        folder = os.path.dirname(target)
        while folder != "/":
            if os.stat(folder).st_uid == os.getuid():
                os.chmod(folder, 0o755)
            folder = os.path.dirname(folder)
    uid, gid = os.getuid(), os.getgid()
    user, group = ("nobody", "nogroup") if uid == _NOBODY else ("sandbox", "sandbox")
    files = {
        "/etc/hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "/etc/hostname": _HOSTNAME + "\n",
        "/etc/passwd": f"root:x:0:0:root:/root:/bin/sh\n{user}:x:{uid}:{gid}:{user}:{_WORKDIR}:/bin/sh\n",
        "/etc/group": f"root:x:0:\n{group}:x:{gid}:\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        _BIN + "/pytest": _PYTEST.format(python=sys.executable, folder=_PYTEST_DIR),
    }
    for path, text in files.items():
        with open(path, "w") as f:
            f.write(text)
    os.chmod(_BIN + "/pytest", 0o755)
    for name, target in [("python", sys.executable), ("python3", sys.executable), *commands]:
        os.symlink(target, f"{_BIN}/{name}")


def _main():
    mode, control_fd = sys.argv[1], int(sys.argv[2])
    os.set_inheritable(control_fd, False)  # this interpreter's, never a command's
    count = int(sys.argv[6])
    flat = sys.argv[7:7 + 2 * count]
    if mode == "unshare":
        _isolate(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), list(zip(flat[::2], flat[1::2])))
    _furnish(flat[1::2], [arg.split("=", 1) for arg in sys.argv[7 + 2 * count:]])
    os.write(control_fd, b"R")
    request = marshal.loads(_read_exact(int(_read_exact(10))))
    _write_files(request["files"], control_fd)
    if request["run"] is None:
        _run_python(request, control_fd)
    else:
        _write_files({request["source"]: request["code"].encode("utf-8", "surrogatepass")}, control_fd)
        _run_command(request, control_fd)


_main()
