"""What the player sees, rendered from the game's state: TextWorld's engine keeps the facts
(``at(P, kitchen)``, ``in(apple, fridge)``, ``open(fridge)``, ``north_of(hall, kitchen)`` …) but its
text comes from the compiled game's z-machine, which this plugin does not run (toolrl_textworld.upstream).

A view is a function of the state alone: the room, what is in sight (containers' contents when they are
open, what lies on supporters), the exits and their doors, what the player carries. Two trajectories in
the same state read the same view, which is the session's state key (``gigpo``'s anchor states).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DIRECTIONS = ("north", "south", "east", "west")
STATES = ("locked", "closed", "open")  # what a container or door's name is shown with
PLAYER, INVENTORY = "P", "I"


@dataclass(frozen=True)
class Fact:
    """One proposition of the state: ``name(arguments)``, each argument's name and TextWorld type."""

    name: str
    arguments: tuple[str, ...]
    types: tuple[str, ...]


def facts_of(propositions: Iterable[Any], names: Mapping[str, str]) -> list[Fact]:
    """TextWorld's propositions (``textworld.logic.Proposition``, over entity ids) as :class:`Fact` objects
    over the entities' ``names`` (id -> name; the player and the inventory keep theirs)."""
    return [Fact(str(p.name), tuple(names.get(str(v.name), str(v.name)) for v in p.arguments),
                 tuple(str(v.type) for v in p.arguments)) for p in propositions]


@dataclass
class World:
    """The facts indexed the way a view reads them."""

    room: str = ""
    placed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # room -> things
    inside: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # holder -> things
    relation: dict[str, str] = field(default_factory=dict)  # holder -> in (a container) | on (a supporter)
    state: dict[str, str] = field(default_factory=dict)  # container/door -> locked|closed|open
    exits: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))  # room -> (dir, to)
    doors: dict[tuple[str, str], str] = field(default_factory=dict)  # (room, room) -> door

    @classmethod
    def of(cls, facts: Sequence[Fact]) -> World:
        world = cls()
        for f in facts:
            args = f.arguments
            if f.name == "at" and args[0] == PLAYER:
                world.room = args[1]
            elif f.name == "at" and f.types[1] == "r":
                world.placed[args[1]].append(args[0])
            elif f.name in ("in", "on"):
                world.inside[args[1]].append(args[0])
                world.relation[args[1]] = f.name
            elif f.name in STATES and len(args) == 1:
                world.state[args[0]] = f.name
            elif f.name.endswith("_of") and f.name[:-3] in DIRECTIONS:  # north_of(a, b): a is north of b
                world.exits[args[1]].append((f.name[:-3], args[0]))
            elif f.name == "link":
                world.doors[(args[0], args[2])] = args[1]
        for things in (*world.placed.values(), *world.inside.values()):
            things.sort()
        return world


def article(name: str) -> str:
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _thing(world: World, name: str) -> str:
    state = world.state.get(name)
    return article(name) + (f" ({state})" if state else "")


def _contents(world: World, holder: str) -> list[str]:
    """Sentences for what lies in or on ``holder`` and, in turn, in what that holds (shut containers hide theirs)."""
    if world.state.get(holder) in ("closed", "locked") or not world.inside.get(holder):
        return []
    things = world.inside[holder]
    out = [f"{world.relation[holder].title()} the {holder}: {listed([_thing(world, t) for t in things])}."]
    for thing in things:
        out += _contents(world, thing)
    return out


def view(world: World) -> str:
    """The room as the player sees it (module docstring)."""
    room = world.room
    lines = [f"-= {room.title()} =-"]
    things = world.placed.get(room, [])
    seen = [f"You see {listed([_thing(world, t) for t in things])}." if things else "The room is empty."]
    for thing in things:
        seen += _contents(world, thing)
    lines.append(" ".join(seen))
    exits = []
    for direction, to in sorted(world.exits.get(room, []), key=lambda e: DIRECTIONS.index(e[0])):
        door = world.doors.get((room, to))
        exits.append(f"{direction} (through {_thing(world, door)})" if door else direction)
    lines.append(f"Exits: {', '.join(exits)}." if exits else "There is no exit.")
    lines.append(inventory(world))
    return "\n".join(lines)


def inventory(world: World) -> str:
    carried = world.inside.get(INVENTORY, [])
    return f"You carry {listed([article(t) for t in carried])}." if carried else "You carry nothing."
