"""Deep Search world: seeded fictional entities, typed relations, passages and questions.

Every name is made of invented syllables, so a model cannot answer from what it memorised in
pre-training: it has to search. Each relation is functional (a subject has exactly one object),
so a chain of relations from a named start entity has one answer, and each hop's fact is stated
in exactly one passage, in a fixed sentence pattern the scripted agent can read back.

    world = build_world(0)
    question = world.questions("eval")[0]
    question.text, question.answer, [hop.query for hop in question.chain]
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from horizonrl.envpool.deepsearch.retriever import Passage

KINDS = ("person", "city", "country", "company", "film", "university")


@dataclass(frozen=True, slots=True)
class Relation:
    """One typed, functional relation and the three ways it is written down."""

    name: str
    subject: str
    object: str
    sentence: str
    """The passage sentence stating the fact, with {s} and {o}."""
    query: str
    """The gold search query for this hop, with {s}; shares its key word with `sentence`."""
    phrase: str
    """The question's noun phrase for the object, with {x} (the subject's phrase)."""


RELATIONS = (
    Relation("born_in", "person", "city", "{s} was born in {o}.", "{s} born in",
             "the birthplace of {x}"),
    Relation("works_for", "person", "company", "{s} works for {o}.", "{s} works for",
             "the employer of {x}"),
    Relation("studied_at", "person", "university", "{s} studied at {o}.", "{s} studied at",
             "the university where {x} studied"),
    Relation("mentored_by", "person", "person", "{s} was mentored by {o}.", "{s} mentored by",
             "the mentor of {x}"),
    Relation("located_in", "city", "country", "{s} lies in the country of {o}.", "{s} country",
             "the country that contains {x}"),
    Relation("capital", "country", "city", "The capital of {s} is {o}.", "capital of {s}",
             "the capital of {x}"),
    Relation("founded_by", "company", "person", "{s} was founded by {o}.", "{s} founded by",
             "the founder of {x}"),
    Relation("headquartered_in", "company", "city", "{s} is headquartered in {o}.",
             "{s} headquartered in", "the city where {x} is headquartered"),
    Relation("directed_by", "film", "person", "{s} was directed by {o}.", "{s} directed by",
             "the director of {x}"),
    Relation("starring", "film", "person", "{s} stars {o} in the lead role.", "{s} stars lead",
             "the lead actor of {x}"),
    Relation("campus_in", "university", "city", "The campus of {s} is in {o}.", "campus of {s}",
             "the city that hosts the campus of {x}"),
)
RELATION = {r.name: r for r in RELATIONS}
_ASK = {"person": "Who is"}  # every other answer kind is asked with "What is"

# Words in the templates and trivia must never be generated as a name, or a name would match
# every passage that uses the word.
_SUFFIXES = {
    "company": ("Systems", "Industries", "Holdings", "Labs", "Group", "Dynamics", "Foundry"),
    "film": ("Dawn", "Tide", "Harvest", "Ember", "Echoes", "Winter", "Crossing", "Lantern"),
    "university": ("Institute", "Academy", "University", "College"),
}
_TRIVIA = (
    "{s} is mentioned in several regional chronicles.",
    "{s} was the subject of a short documentary.",
    "Little has been written about {s} outside local archives.",
    "{s} appears in a popular travel guide.",
)
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "dr",
           "kr", "br", "st", "vr", "sh", "gr", "tr", "y", "h", "j")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "y")
_CODAS = ("", "", "", "", "n", "r", "s", "l", "k", "th", "m")


@dataclass(frozen=True, slots=True)
class WorldConfig:
    """How big a world to generate (the defaults give ~3.8k passages and 4k questions)."""

    persons: int = 1200
    cities: int = 240
    countries: int = 24
    companies: int = 180
    films: int = 300
    universities: int = 60
    mentored_fraction: float = 0.7
    """Share of persons with a mentor; mentors come from the rest, so no one is both."""
    trivia_fraction: float = 0.15
    """Share of entities with an extra fact-free passage (a distractor that names them)."""
    questions_per_hop: int = 1000
    eval_fraction: float = 0.2


@dataclass(frozen=True, slots=True)
class Hop:
    """One step of a question's gold chain: search `query`, read `answer` in `passage_id`."""

    subject: str
    relation: str
    query: str
    answer: str
    passage_id: str


@dataclass(frozen=True, slots=True)
class Question:
    """A 1- to 4-hop question; `chain[-1].answer == answer`."""

    id: str
    text: str
    answer: str
    hops: int
    chain: tuple[Hop, ...]


@dataclass(frozen=True)
class World:
    """Entities (name -> kind), facts ((subject, relation) -> object), passages and questions."""

    seed: int
    entities: dict[str, str]
    facts: dict[tuple[str, str], str]
    passages: tuple[Passage, ...]
    train: tuple[Question, ...]
    eval: tuple[Question, ...]
    fact_passage: dict[tuple[str, str], str] = field(repr=False)

    def questions(self, split: str) -> tuple[Question, ...]:
        """The fixed questions of "train" or "eval", hop counts interleaved 1, 2, 3, 4, 1, ..."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return self.train if split == "train" else self.eval


def _word(rng: random.Random, used: set[str]) -> str:
    """A fresh 2- or 3-syllable capitalised word, never used before in this world."""
    for _ in range(1000):  # the syllable space is ~10^8 words; collisions are rare
        n = 2 if rng.random() < 0.7 else 3
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                       for _ in range(n))
        if 4 <= len(word) <= 10 and word not in used and "yy" not in word:
            used.add(word)
            return word.capitalize()
    raise RuntimeError("name space exhausted")


def _reserved() -> set[str]:
    """Lowercase words already in templates, suffixes and trivia (never generated as names)."""
    texts = [t for r in RELATIONS for t in (r.sentence, r.query, r.phrase)] + list(_TRIVIA)
    texts += [s for group in _SUFFIXES.values() for s in group] + ["who what is"]
    return {w for t in texts for w in re.findall(r"[a-z]+", t.lower())}


def _names(cfg: WorldConfig, rng: random.Random) -> dict[str, list[str]]:
    """Names per kind; persons share first and last names (look-alikes that BM25 must tell apart),
    companies and films share stems across suffixes."""
    used = _reserved()
    firsts = [_word(rng, used) for _ in range(cfg.persons // 8)]
    lasts = [_word(rng, used) for _ in range(cfg.persons // 3)]
    persons: list[str] = []
    seen: set[str] = set()
    for _ in range(cfg.persons * 20):
        if len(persons) == cfg.persons:
            break
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in seen:
            seen.add(name)
            persons.append(name)
    names = {"person": persons,
             "city": [_word(rng, used) for _ in range(cfg.cities)],
             "country": [_word(rng, used) for _ in range(cfg.countries)]}
    for kind, count in (("company", cfg.companies), ("film", cfg.films),
                        ("university", cfg.universities)):
        stems = [_word(rng, used) for _ in range(max(1, (count * 3) // 4))]
        pairs = {(s, x) for s in stems for x in _SUFFIXES[kind]}
        names[kind] = [f"{s} {x}" for s, x in rng.sample(sorted(pairs), count)]
    return names


def _facts(cfg: WorldConfig, names: dict[str, list[str]], rng: random.Random) -> dict:
    """Draw every relation's object for every subject (functional relations)."""
    people, cities, countries = names["person"], names["city"], names["country"]
    facts: dict[tuple[str, str], str] = {}
    for i, city in enumerate(cities):  # round-robin first so every country has a city
        facts[city, "located_in"] = countries[i] if i < len(countries) else rng.choice(countries)
    for country in countries:
        facts[country, "capital"] = rng.choice(
            [c for c in cities if facts[c, "located_in"] == country])
    n_mentored = int(len(people) * cfg.mentored_fraction)
    mentees, mentors = people[:n_mentored], people[n_mentored:]
    for person in people:
        facts[person, "born_in"] = rng.choice(cities)
        facts[person, "works_for"] = rng.choice(names["company"])
        facts[person, "studied_at"] = rng.choice(names["university"])
    for person in mentees:
        facts[person, "mentored_by"] = rng.choice(mentors)
    for company in names["company"]:
        facts[company, "founded_by"] = rng.choice(people)
        facts[company, "headquartered_in"] = rng.choice(cities)
    for film in names["film"]:
        director, lead = rng.sample(people, 2)
        facts[film, "directed_by"] = director
        facts[film, "starring"] = lead
    for university in names["university"]:
        facts[university, "campus_in"] = rng.choice(cities)
    return facts


def _passages(cfg: WorldConfig, names: dict[str, list[str]], facts: dict,
              rng: random.Random) -> tuple[list[Passage], dict[tuple[str, str], str]]:
    """Each entity's facts in passages of one or two sentences, plus fact-free distractors."""
    by_subject: dict[str, list[str]] = {}
    for subject, relation in facts:
        by_subject.setdefault(subject, []).append(relation)
    passages: list[Passage] = []
    where: dict[tuple[str, str], str] = {}
    for kind in KINDS:
        for name in names[kind]:
            relations = by_subject.get(name, [])
            rng.shuffle(relations)
            i = 0
            while i < len(relations):
                size = 2 if rng.random() < 0.5 else 1
                chunk = relations[i : i + size]
                pid = f"p{len(passages):05d}"
                text = " ".join(RELATION[r].sentence.format(s=name, o=facts[name, r])
                                for r in chunk)
                passages.append(Passage(pid, name, text))
                where.update({(name, r): pid for r in chunk})
                i += size
            if rng.random() < cfg.trivia_fraction:
                text = rng.choice(_TRIVIA).format(s=name)
                passages.append(Passage(f"p{len(passages):05d}", name, text))
    return passages, where


def _sample_chain(hops: int, names: dict, facts: dict, rng: random.Random) -> list | None:
    """A random walk of `hops` relations from a random entity, visiting no entity twice."""
    kind = rng.choice(KINDS)
    start = rng.choice(names[kind])
    chain, current, seen = [], start, {start}
    for _ in range(hops):
        options = [r for r in RELATIONS if r.subject == kind and (current, r.name) in facts]
        options = [r for r in options if facts[current, r.name] not in seen]
        if not options:
            return None
        relation = rng.choice(options)
        nxt = facts[current, relation.name]
        chain.append((current, relation, nxt))
        seen.add(nxt)
        current, kind = nxt, relation.object
    return chain


def _question(qid: str, chain: list, where: dict) -> Question | None:
    """The question text for a chain, or None if its answer would show in the text."""
    phrase = chain[0][0]
    for _, relation, _ in chain:
        phrase = relation.phrase.format(x=phrase)
    answer = chain[-1][2]
    text = f"{_ASK.get(chain[-1][1].object, 'What is')} {phrase}?"
    if re.search(rf"\b{re.escape(answer.lower())}\b", text.lower()):
        return None
    hops = tuple(Hop(s, r.name, r.query.format(s=s), o, where[s, r.name]) for s, r, o in chain)
    return Question(qid, text, answer, len(chain), hops)


def _questions(cfg: WorldConfig, names: dict, facts: dict, where: dict,
               rng: random.Random) -> tuple[tuple[Question, ...], tuple[Question, ...]]:
    """`questions_per_hop` distinct questions per hop count, split and interleaved by hops."""
    train: list[list[Question]] = []
    evals: list[list[Question]] = []
    for hops in (1, 2, 3, 4):
        found: dict[tuple, Question] = {}
        for _ in range(cfg.questions_per_hop * 20):
            if len(found) == cfg.questions_per_hop:
                break
            chain = _sample_chain(hops, names, facts, rng)
            key = chain and (chain[0][0], *(r.name for _, r, _ in chain))
            if not chain or key in found:
                continue
            question = _question(f"h{hops}-{len(found):04d}", chain, where)
            if question is not None:
                found[key] = question
        items = list(found.values())
        n_eval = max(1, int(len(items) * cfg.eval_fraction))
        evals.append(items[:n_eval])
        train.append(items[n_eval:])

    def interleave(groups: list[list[Question]]) -> tuple[Question, ...]:
        longest = max(len(g) for g in groups)
        return tuple(g[i] for i in range(longest) for g in groups if i < len(g))

    return interleave(train), interleave(evals)


@lru_cache(maxsize=4)
def build_world(seed: int = 0, config: WorldConfig | None = None) -> World:
    """The world for `seed` (cached per process; the same seed always gives the same world)."""
    cfg = config or WorldConfig()
    rng = random.Random(f"deepsearch-world-{seed}")
    names = _names(cfg, rng)
    facts = _facts(cfg, names, rng)
    passages, where = _passages(cfg, names, facts, rng)
    train, evals = _questions(cfg, names, facts, where, rng)
    entities = {name: kind for kind in KINDS for name in names[kind]}
    return World(seed, entities, facts, tuple(passages), train, evals, where)
