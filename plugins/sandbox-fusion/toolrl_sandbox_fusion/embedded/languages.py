"""The languages the embedded sandbox runs as commands (all but ``python``, which runs in the sandbox's
own interpreter), with SandboxFusion's commands for each, and the host toolchains they need.

A toolchain is found on this process's PATH, as SandboxFusion finds it on its server's. Inside the
sandbox its command is a link in ``/run/toolrl/bin`` (first on PATH) to the real executable; a
toolchain outside ``/usr`` has its folder mounted read-only at the same path, like the interpreter,
and one inside ``/usr`` gets the files its links point to outside ``/usr`` (a Debian JDK's
``/etc/java-17-openjdk/...``). A language whose toolchain is absent is a clear ``SandboxError``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

# Where the bootstrap puts the commands (links) and where the fallback pytest is mounted.
BIN = "/run/toolrl/bin"
PYTEST_DIR = "/run/toolrl/pytest"
JUPYTER_DIR = "/run/toolrl/jupyter"  # jupyter_client and ipykernel, when the sandbox's Python lacks them


@dataclass(frozen=True)
class Language:
    source: str  # the file the code is written to, in the working folder
    run: tuple[str, ...]
    compile: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # commands the host must have
    env: tuple[tuple[str, str], ...] = ()


# Go's build cache is the pool's, warmed once and read-only here (gocache.py): a run reads what the
# warm-up compiled (the standard library: half a minute on two cores) and cannot change it for others.
GO_CACHE = "/run/toolrl/go-build"
_GO_ENV = (("GOCACHE", GO_CACHE), ("GOPATH", "/tmp/go"), ("GOTOOLCHAIN", "local"))
# JVM commands size their heap as if the machine had the run's memory limit (as the JVM does in a
# container with that limit); without it a JVM commits 1/64 of the host's memory at start, which on a
# large host is beyond a limit that Java programs fit in. "{javac_jvm}": the same, passed through javac.
JUNIT_LAUNCHERS = ("/usr/share/java/junit-platform-console-standalone.jar",)  # Debian's junit5
# SandboxFusion's runners (sandbox/runners/major.py, minor.py), each a file in the working folder.
LANGUAGES: dict[str, Language] = {
    "bash": Language("main.sh", ("/bin/bash", "main.sh")),
    "pytest": Language("test_main.py", ("pytest", "test_main.py")),
    "cpp": Language("main.cpp", ("./test",), ("g++", "-std=c++17", "main.cpp", "-o", "test"), ("g++",)),
    "go": Language("main.go", ("./out",), ("go", "build", "-o", "out", "main.go"), ("go",), _GO_ENV),
    "go_test": Language("main_test.go", ("go", "test", "main_test.go"), (), ("go",), _GO_ENV),
    "java": Language("Main.java", ("java", "{jvm}", "-cp", "{classpath}", "-ea", "Main"),
                     ("javac", "{javac_jvm}", "-cp", "{classpath}", "Main.java"), ("javac", "java")),
    # The file is named after the code's public class; javac compiles it with the request's .java files.
    "junit": Language("{class}.java", ("java", "{jvm}", "-jar", "{junit}", "--class-path", "{classpath}",
                                       "--scan-class-path", "--disable-banner"),
                      ("javac", "{javac_jvm}", "-cp", "{classpath}", "{sources}"), ("javac", "java")),
    "nodejs": Language("main.js", ("node", "main.js"), (), ("node",)),
    "typescript": Language("main.ts", ("tsx", "main.ts"), (), ("tsx",)),
    "php": Language("main.php", ("php", "-f", "main.php"), (), ("php",)),
    "rust": Language("main.rs", ("./test",), ("rustc", "main.rs", "-o", "test"), ("rustc",)),
    "lua": Language("main.lua", ("lua", "main.lua"), (), ("lua",)),
    "R": Language("main.R", ("Rscript", "main.R"), (), ("Rscript",)),
    "perl": Language("main.pl", ("perl", "main.pl"), (), ("perl",)),
    "ruby": Language("main.rb", ("ruby", "main.rb"), (), ("ruby",)),
    "julia": Language("main.jl", ("julia", "main.jl"), (), ("julia",)),
    "racket": Language("main.rkt", ("racket", "main.rkt"), (), ("racket",)),
    "D_ut": Language("main.d", ("./test",), ("dmd", "main.d", "-unittest", "-of=test"), ("dmd",)),
    "swift": Language("main.swift", ("./test.out",), ("swiftc", "main.swift", "-o", "test.out"), ("swiftc",)),
    "kotlin_script": Language("main.kts", ("kotlin", "main.kts"), (), ("kotlin",)),
    "verilog": Language("main.sv", ("vvp", "-n", "test.vvp"), (
        "iverilog", "-Wall", "-Winfloop", "-Wno-timescale", "-g2012", "-s", "tb", "-o", "test.vvp", "main.sv"),
        ("iverilog", "vvp")),
}
# SandboxFusion's other languages need what its image ships besides a toolchain.
UNSUPPORTED: dict[str, str] = {
    "jest": ("it needs jest with TypeScript through babel (jest, babel-jest, @babel/preset-env, "
             "@babel/preset-typescript, @jest/globals: SandboxFusion's node_modules), which come only from npm; "
             "Debian's jest package needs Debian's own nodejs"),
    "lean": "it needs SandboxFusion's Lean project (lakefile, mathlib packages)",
    "csharp": "it needs a dotnet project template from SandboxFusion's image",
    "scala": "it needs SandboxFusion's Scala runtime setup",
    "sql": "SandboxFusion has no runner for it either",
    "cuda": "it needs a GPU",
    "python_gpu": "it needs a GPU",
}
# Toolchains that say where they live (a rustup proxy is not the compiler; GOROOT is go's home).
_HOME_QUERIES: dict[str, tuple[str, ...]] = {"rustc": ("--print", "sysroot"), "go": ("env", "GOROOT")}
# Libraries SandboxFusion links C++ programs with when the compiler can find them.
_CPP_LIBRARIES = ("crypto", "ssl", "pthread")


@dataclass(frozen=True)
class Program:
    """One request's commands, as the bootstrap runs them."""

    source: str
    code: str
    run: list[str]
    compile: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Toolchains:
    """What this host has: commands (name -> executable inside the sandbox), read-only mounts
    (host source, sandbox target), and why a language cannot run."""

    commands: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    cpp_flags: tuple[str, ...] = ()
    junit: str = ""  # the JUnit console launcher jar

    def program(self, language: str, code: str, files: dict[str, str | None], args: list[str],
                memory_mb: int | None = None) -> Program:
        """The commands for one request (``memory_mb``: its memory limit); ValueError (the message says
        why) when it cannot run here."""
        if language in UNSUPPORTED:
            raise ValueError(f"language {language!r} is not supported by the embedded sandbox: {UNSUPPORTED[language]}")
        why = dict(self.missing).get(language)
        if why:
            raise ValueError(f"language {language!r} cannot run here: {why}")
        spec = LANGUAGES[language]
        # As SandboxFusion: the jars a request brings are on the class path (junit's after its
        # launcher), PHP gets its opening tag, a junit file is named after its public class.
        jars = [name for name in files if name.endswith(".jar")]
        junit = self.junit
        source = spec.source.replace("{class}", _public_class(code) or "Main")
        values = {
            "{classpath}": ":".join(["."] + ([junit] if language == "junit" else []) + jars),
            "{jvm}": f"-XX:MaxRAM={memory_mb}m" if memory_mb else "",
            "{javac_jvm}": f"-J-XX:MaxRAM={memory_mb}m" if memory_mb else "",
            "{junit}": junit,
        }
        sources = [source] + [name for name in files if name.endswith(".java") and "/" not in name and name != source]

        def expand(argv: tuple[str, ...]) -> list[str]:
            out: list[str] = []
            for arg in argv:
                if arg == "{sources}":
                    out += sources
                elif arg in values and not values[arg]:
                    continue  # an option that does not apply (no memory limit)
                else:
                    out.append(values.get(arg, arg.replace("{classpath}", values["{classpath}"])))
            return out

        compile_ = expand(spec.compile) or None
        if language == "cpp":
            compile_ = [*spec.compile, *self.cpp_flags]
        if language == "php" and not code.lstrip().startswith("<?php"):
            code = "<?php\n" + code.lstrip()
        return Program(source, code, expand(spec.run) + list(args), compile_, dict(spec.env))


def _public_class(code: str) -> str | None:
    """The name of a Java file's public top-level class, which javac wants as its file name."""
    found = re.search(r"^\s*public\s+(?:(?:final|abstract|strictfp)\s+)*(?:class|interface|enum|record)\s+(\w+)",
                      code, re.MULTILINE)
    return found.group(1) if found else None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _system(path: str) -> bool:
    """Visible in every sandbox already: /usr and the root links into it."""
    return _within(path, "/usr") or os.path.dirname(path) in ("/bin", "/sbin", "/lib", "/lib64")


def _locate(name: str) -> tuple[str, str] | None:
    """(executable, home) of a command on this process's PATH, links resolved; None if absent."""
    found = shutil.which(name)
    if found is None:
        return None
    query = _HOME_QUERIES.get(name)
    if query:
        try:
            proc = subprocess.run([found, *query], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        home = proc.stdout.strip()
        executable = os.path.join(home, "bin", name)
        return (executable, home) if proc.returncode == 0 and os.access(executable, os.X_OK) else None
    executable = os.path.realpath(found)
    return executable, os.path.dirname(os.path.dirname(executable))


def _outside_links(home: str, limit: int = 20000) -> list[str]:
    """What links in a toolchain folder under /usr reach outside /usr: a Debian JDK keeps its
    configuration in /etc/java-17-openjdk. The folder a file is in when it is a package's folder in
    /etc (one mount, not one per file: each costs start-up time), else the file itself."""
    found: list[str] = []
    for count, (folder, dirs, files) in enumerate(os.walk(home)):
        if count > limit:
            break
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not _within(target, "/usr") and os.path.isfile(target):
                    folder = os.path.dirname(target)
                    found.append(folder if _within(folder, "/etc") and folder != "/etc" else target)
    return found


@functools.cache
def _cpp_flags(gxx: str) -> tuple[str, ...]:
    flags = []
    for library in _CPP_LIBRARIES:
        for kind in ("so", "a"):  # glibc 2.34+ keeps only an empty libpthread.a
            try:
                proc = subprocess.run([gxx, f"-print-file-name=lib{library}.{kind}"], capture_output=True, text=True,
                                      timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if os.path.isabs(proc.stdout.strip()):  # an unknown library prints back its bare name
                flags.append(f"-l{library}")
                break
    return tuple(flags)


def pytest_mounts(python_version: str) -> tuple[list[tuple[str, str]], str | None]:
    """This process's pytest and what it requires, mounted in PYTEST_DIR for a sandbox interpreter
    without pytest; or why it cannot be."""
    return package_mounts(("pytest",), python_version, PYTEST_DIR)


def jupyter_mounts(python_version: str) -> tuple[list[tuple[str, str]], str | None]:
    """This process's jupyter_client and ipykernel and what they require, mounted in JUPYTER_DIR for a
    sandbox interpreter without them; or why they cannot be. They hold compiled modules (pyzmq,
    psutil...), so the sandbox's Python must be this process's major.minor version."""
    import sys

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if ".".join(python_version.split(".")[:2]) != here:
        return [], (f"the sandbox's Python {python_version} has no jupyter_client and ipykernel, and this "
                    f"process's (Python {here}) hold compiled modules for another version: give the sandbox "
                    "a Python that has them (python_executable)")
    return package_mounts(("jupyter_client", "ipykernel"), python_version, JUPYTER_DIR)


def package_mounts(names: tuple[str, ...], python_version: str, folder: str) -> tuple[list[tuple[str, str]], str | None]:
    """The distributions ``names`` of this process and everything they require for ``python_version``
    (the sandbox's), as read-only mounts in ``folder``; or why they cannot be."""
    from importlib import metadata

    wanted = " and ".join(names)
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pytest and ipykernel require packaging
        return [], f"neither the sandbox's Python nor this process has {wanted}"
    environment = {**default_environment(), "python_version": ".".join(python_version.split(".")[:2]),
                   "python_full_version": python_version, "extra": ""}
    mounts: dict[str, str] = {}
    pending, seen = list(names), set()
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return [], f"the sandbox's Python has no {wanted}, and this process's {names[0]} lacks {name}"
        if name in names and not SpecifierSet(dist.metadata.get("Requires-Python") or "").contains(python_version):
            return [], (f"the sandbox's Python {python_version} has no {wanted}, and this process's {name} "
                        f"{dist.version} needs Python {dist.metadata['Requires-Python']}")
        for entry in dist.files or ():
            top = entry.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue  # the metadata folder stays: packages ask it for their version
            mounts.setdefault(top, str(dist.locate_file(top)))
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                pending.append(requirement.name)
    return [(source, f"{folder}/{top}") for top, source in sorted(mounts.items())], None


def base_toolchains() -> Toolchains:
    """What every sandbox has, python's too: Debian's command links (cc, awk, java...) lead through
    /etc/alternatives."""
    return Toolchains(mounts=(("/etc/alternatives", "/etc/alternatives"),) if os.path.isdir("/etc/alternatives") else ())


@functools.cache
def discover(python_version: str, has_pytest: bool) -> Toolchains:
    """The toolchains of this host for a sandbox whose Python is ``python_version``."""
    commands: dict[str, str] = {}
    mounts: dict[str, str] = dict(base_toolchains().mounts)
    missing: dict[str, str] = {}
    if not has_pytest:
        found, why = pytest_mounts(python_version)
        mounts.update(found)
        if why:
            missing["pytest"] = why
    for language, spec in LANGUAGES.items():
        absent = []
        for name in spec.needs:
            located = _locate(name) if name not in commands else (commands[name], "")
            if located is None:
                absent.append(name)
                continue
            executable, home = located
            commands[name] = executable
            if not home:  # met for an earlier language
                continue
            if not _system(executable):  # mounted like the interpreter: its folder, at the same path
                folder = executable if home == "/" else home
                mounts.setdefault(folder, folder)
            elif home not in ("/usr", "/usr/local") and _within(home, "/usr"):
                mounts.update((target, target) for target in _outside_links(home))
        if absent:
            missing[language] = (f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed "
                                 "(not found on the PATH of the process running the sandbox)")
    launcher = None
    if "junit" not in missing:
        # Not a command: the console launcher jar, found where the distribution puts it (under /usr).
        launcher = next((jar for jar in JUNIT_LAUNCHERS if os.path.isfile(jar)), None)
        if launcher is None:
            missing["junit"] = ("the JUnit console launcher is not installed (junit-platform-console-standalone.jar: "
                                "apt-get install junit5)")
    flags = _cpp_flags(commands["g++"]) if "g++" in commands else ()
    kept = [(s, t) for s, t in mounts.items() if not any(t != o and _within(t, o) for o in mounts.values())]
    return Toolchains(tuple(sorted(commands.items())), tuple(kept), tuple(sorted(missing.items())), flags,
                      launcher or "")
