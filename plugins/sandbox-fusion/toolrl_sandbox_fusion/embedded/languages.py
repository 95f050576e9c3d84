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


@dataclass(frozen=True)
class Language:
    source: str  # the file the code is written to, in the working folder
    run: tuple[str, ...]
    compile: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # commands the host must have
    env: tuple[tuple[str, str], ...] = ()


_GO_ENV = (("GOCACHE", "/tmp/go-build"), ("GOPATH", "/tmp/go"), ("GOTOOLCHAIN", "local"))
# SandboxFusion's runners (sandbox/runners/major.py, minor.py), each a file in the working folder.
LANGUAGES: dict[str, Language] = {
    "bash": Language("main.sh", ("/bin/bash", "main.sh")),
    "pytest": Language("test_main.py", ("pytest", "test_main.py")),
    "cpp": Language("main.cpp", ("./test",), ("g++", "-std=c++17", "main.cpp", "-o", "test"), ("g++",)),
    "go": Language("main.go", ("./out",), ("go", "build", "-o", "out", "main.go"), ("go",), _GO_ENV),
    "go_test": Language("main_test.go", ("go", "test", "main_test.go"), (), ("go",), _GO_ENV),
    "java": Language("Main.java", ("java", "-cp", "{classpath}", "-ea", "Main"),
                     ("javac", "-cp", "{classpath}", "Main.java"), ("javac", "java")),
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
    "junit": "it needs SandboxFusion's JUnit console launcher and jars",
    "jest": "it needs SandboxFusion's node_modules, package.json and babel config",
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

    def program(self, language: str, code: str, files: dict[str, str | None], args: list[str]) -> Program:
        """The commands for one request; ValueError (the message says why) when it cannot run here."""
        if language in UNSUPPORTED:
            raise ValueError(f"language {language!r} is not supported by the embedded sandbox: {UNSUPPORTED[language]}")
        why = dict(self.missing).get(language)
        if why:
            raise ValueError(f"language {language!r} cannot run here: {why}")
        spec = LANGUAGES[language]
        # As SandboxFusion: the jars a request brings are on the class path, PHP gets its opening tag.
        classpath = ":".join(["."] + [name for name in files if name.endswith(".jar")])
        compile_ = [a.replace("{classpath}", classpath) for a in spec.compile] or None
        if language == "cpp":
            compile_ = [*spec.compile, *self.cpp_flags]
        if language == "php" and not code.lstrip().startswith("<?php"):
            code = "<?php\n" + code.lstrip()
        run = [a.replace("{classpath}", classpath) for a in spec.run] + list(args)
        return Program(spec.source, code, run, compile_, dict(spec.env))


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
    """This process's pytest and what it requires for ``python_version`` (the sandbox's), mounted in
    PYTEST_DIR for an interpreter without pytest; or why it cannot be."""
    from importlib import metadata

    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pytest requires packaging: no packaging, no pytest
        return [], "neither the sandbox's Python nor this process has pytest"
    environment = {**default_environment(), "python_version": ".".join(python_version.split(".")[:2]),
                   "python_full_version": python_version, "extra": ""}
    mounts: dict[str, str] = {}
    pending, seen = ["pytest"], set()
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return [], f"the sandbox's Python has no pytest, and this process's pytest lacks {name}"
        if name == "pytest" and not SpecifierSet(dist.metadata.get("Requires-Python") or "").contains(python_version):
            return [], (f"the sandbox's Python {python_version} has no pytest, and this process's pytest "
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
    return [(source, f"{PYTEST_DIR}/{top}") for top, source in sorted(mounts.items())], None


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
    flags = _cpp_flags(commands["g++"]) if "g++" in commands else ()
    kept = [(s, t) for s, t in mounts.items() if not any(t != o and _within(t, o) for o in mounts.values())]
    return Toolchains(tuple(sorted(commands.items())), tuple(kept), tuple(sorted(missing.items())), flags)
