"""Instruction templates for the corpus: per unit kind, task family -> (weight, templates).

A template is a ``str.format`` string over the unit's fields (``{text}`` is the unit's content); a
template is eligible for a unit only when the unit has every field it names. Long passages only get
the summarisation templates. Code units get a deliberately injected bug (``{buggy}``) from
:func:`inject_bug`, GSM8K units a claimed answer (``{claimed}``) that is right or wrong at random.
"""

from __future__ import annotations

import ast
import random
import string
from collections.abc import Mapping

from .corpus_sources import Unit

TASKS = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "explanation", "translation",
         "summarization", "qa")
Table = Mapping[str, tuple[float, tuple[str, ...]]]

FOREIGN: Table = {
    "translation": (6.0, (
        "Translate the following {lang} text into English:\n\n{text}",
        "Translate into English:\n\n{text}",
        "Here is a passage from the {lang} manual page of `{title}`. Give an accurate English "
        "translation.\n\n"
        "{text}",
        "{text}\n\nTranslate the text above from {lang} into English.",
        "I found this {lang} documentation and I don't speak {lang}. Can you translate it into English for "
        "me?\n\n{text}",
    )),
    "summarization": (1.0, (
        "Summarize this {lang} text in English, in a few sentences:\n\n{text}",
        "Here is an excerpt from the {lang} manual page of `{title}`. Write a short English "
        "summary of it.\n\n"
        "{text}",
    )),
    "extraction": (1.0, (
        "List, in English, every command-line option mentioned in this {lang} text and what it does.\n\n"
        "{text}",
        "Which programs, files or options does this {lang} text mention? Answer in English, as a bulleted "
        "list.\n\n{text}",
    )),
    "explanation": (0.7, (
        "The following is from the {lang} manual page of `{title}`. Explain in English, for a beginner, what "
        "it means.\n\n{text}",
    )),
}
FOREIGN_LONG: Table = {
    "summarization": (1.0, (
        "Summarize the following {lang} text in English. Use a short paragraph followed by the key points as "
        "a list.\n\n{text}",
        "Read this excerpt from the {lang} manual page of `{title}` and write an English summary of it.\n\n"
        "{text}",
    )),
}

PROSE: Table = {
    "qa": (2.0, (
        "Read the passage and answer the question.\n\nPassage:\n{text}\n\nQuestion: What is the main point "
        "of the passage about {title}?",
        "Read the passage and answer the question.\n\nPassage:\n{text}\n\nQuestion: What does the passage "
        "say about {term}?",
        "{text}\n\nBased only on the text above, answer: what should a reader remember about {term}?",
        "Using only the information in the following excerpt from {topic}, answer the question below.\n\n"
        "{text}\n\nQuestion: Why would someone need this, and how is it used?",
        "Context:\n{text}\n\nAccording to the context, how does {term} relate to {title}?",
    )),
    "explanation": (1.5, (
        "Explain the following excerpt from {topic} in simple terms, with an example.\n\n{text}",
        "I am new to this. What does this passage from {topic} mean?\n\n{text}",
        "Explain the key idea of this text as if you were teaching a class:\n\n{text}",
    )),
    "extraction": (1.5, (
        "Extract every {things} mentioned in the text below, as a bulleted list.\n\n{text}",
        "Extract the key facts from this passage as a JSON list of strings.\n\n{text}",
        "Make a table of the terms defined or used in this passage and their meanings.\n\n{text}",
    )),
    "summarization": (1.0, (
        "Summarize the following text in two or three sentences.\n\n{text}",
        "Give a one-paragraph summary of this excerpt from {topic}:\n\n{text}",
    )),
    "coding": (0.8, (
        "Based on the documentation below, write a short {program} example that uses what it describes, "
        "with comments.\n\n{text}",
    )),
    "roleplay": (0.8, (
        "You are {persona}. A {asker} asks you about {title}. Using the notes below, answer them in "
        "character.\n\nNotes:\n{text}",
        "Pretend you are {persona} giving a short talk on {title}. Base the talk on this material:\n\n{text}",
    )),
    "writing": (0.8, (
        "Write a short blog post for beginners about {title}, based on these notes:\n\n{text}",
        "Write a friendly email to a colleague that explains {title}, using this material:\n\n{text}",
    )),
}
PROSE_LONG: Table = {
    "summarization": (1.0, (
        "Summarize the following text. Start with one sentence stating the main idea, then list the key "
        "points.\n\n{text}",
        "Here is a long excerpt from {topic}, from the part about {title}. Write a concise summary of it.\n\n"
        "{text}",
        "Read the following and write a TL;DR of at most five sentences.\n\n{text}",
        "Condense this excerpt from {topic} into a short summary for someone who has no time to read it:\n\n"
        "{text}",
    )),
}

CODE: Table = {
    "coding": (6.0, (
        "Explain what this Python {what} does, step by step:\n\n```python\n{text}\n```",
        "What does the following code from the `{module}` module do? Explain it in plain English.\n\n"
        "```python\n{text}\n```",
        "Write a Python function with the signature `{sigline}:` that does the following:\n\n{summary}",
        "Implement this in Python: {summary}",
        "The following Python {what} from the `{module}` module has a bug that was put there "
        "on purpose. Find "
        "the bug, explain it, and show the fix.\n\n```python\n{buggy}\n```",
        "Add type hints to this function and briefly explain your choices.\n\n```python\n{unannotated}\n```",
        "Write a docstring for this Python {what}:\n\n```python\n{bare}\n```",
        "Write pytest unit tests for this {what}:\n\n```python\n{text}\n```",
        "Suggest how to make this code easier to read, and show the improved "
        "version.\n\n```python\n{text}\n```",
    )),
    "qa": (1.0, (
        "Here is a Python {what}.\n\n```python\n{text}\n```\n\nQuestion: what are the inputs and outputs of "
        "`{name}`, and when does it raise an error, if ever?",
        "```python\n{text}\n```\n\nAccording to the code above, what does `{name}` return?",
    )),
}

CONCEPT: Table = {
    "explanation": (2.0, (
        "Explain {word} ({gloss}) in simple terms.",
        "What is {a_word}? Explain it to a high-school student, with an example.",
        "In {domain}, what does '{word}' mean? Explain with an example.",
        "Give a clear explanation of {word}: what it is, how it works and why it matters.",
        "Explain what it means to {word} ({gloss}), and give two examples of sentences using it.",
    )),
    "writing": (1.5, (
        "Write a short story about {a_word}.",
        "Write a poem about {word}.",
        "Write a short essay on {word} ({gloss}).",
        "Write a product description for {a_word}.",
        "Write a paragraph that uses the word '{word}' in the sense of '{gloss}'.",
    )),
    "roleplay": (1.0, (
        "You are {a_word} ({gloss}). Introduce yourself and describe your typical day.",
        "Pretend to be {a_word}. A child asks you what your life is like. Answer in character.",
        "Imagine you are {a_word}. Describe the world from your point of view.",
    )),
    "reasoning": (1.5, (
        "Is every {word} a kind of {hyper}? Explain your reasoning step by step.",
        "Is every {hyper} a kind of {word}? Explain your reasoning.",
        "Which of these does not belong with the others: {odd}? Explain your reasoning.",
        "Compare {word} and {sibling}: how are they similar, and how do they differ?",
    )),
    "qa": (0.5, (
        "Definition: {word} means {gloss}.\nExample: {example}\n\nQuestion: in the example, what does "
        "'{word}' refer to, and how would you say it with other words?",
    )),
}
# template -> the categories (WordNet lexicographer file suffixes) it suits; absent: any
CATEGORY_FILTER: dict[str, frozenset[str]] = {
    "Write a product description for {a_word}.": frozenset({"artifact", "food"}),
    "You are {a_word} ({gloss}). Introduce yourself and describe your typical day.": frozenset({"person"}),
    "Pretend to be {a_word}. A child asks you what your life is like. Answer in character.":
        frozenset({"person", "animal"}),
    "Imagine you are {a_word}. Describe the world from your point of view.":
        frozenset({"animal", "artifact", "plant", "object", "food"}),
    "Write a short story about {a_word}.": frozenset({"person", "animal", "artifact", "location", "event",
                                                     "food", "plant", "object"}),
    "Explain what it means to {word} ({gloss}), and give two examples of sentences using it.":
        frozenset({"body", "change", "cognition", "communication", "competition", "consumption", "contact",
                   "creation", "emotion", "motion", "perception", "possession", "social", "stative",
                   "weather"}),
    "What is {a_word}? Explain it to a high-school student, with an example.":
        frozenset({"act", "animal", "artifact", "attribute", "body", "cognition", "communication", "event",
                   "food", "phenomenon", "plant", "process", "relation", "shape", "state", "substance",
                   "quantity", "object", "group", "location", "time"}),
}
NOUN_ONLY = frozenset({"Explain {word} ({gloss}) in simple terms.",
                       "Give a clear explanation of {word}: what it is, how it works and why it matters.",
                       "Write a poem about {word}.", "Write a short essay on {word} ({gloss})."})

MATH: Table = {
    "math": (4.0, (
        "{text}",
        "Solve step by step: {text}",
        "{text}\nShow your work and give the final answer at the end.",
        "Solve the following math word problem. Explain each step.\n\n{text}",
        "Write a new word problem like this one but with different numbers, then solve it.\n\n{text}",
    )),
    "reasoning": (2.0, (
        "Before solving, list the facts you are given and what is being asked. Then solve the problem.\n\n"
        "{text}",
        "A student answered {claimed} to this problem. Is the student right? Check step by step.\n\n{text}",
        "Explain the reasoning needed to solve this problem, then give the answer.\n\n{text}",
        "Estimate the answer first, then compute it exactly and compare the two.\n\n{text}",
    )),
    "coding": (0.7, ("Write a Python function that solves this problem and returns the answer:\n\n{text}",)),
    "extraction": (0.5, (
        "Extract every quantity in this problem together with what it counts, as a list. Do not solve it.\n\n"
        "{text}",
    )),
    "roleplay": (0.5, (
        "You are a patient math tutor. A student asks for help with this problem; guide them to the answer."
        "\n\n{text}",
    )),
}

TABLES: dict[tuple[str, bool], Table] = {
    ("foreign", False): FOREIGN, ("foreign", True): FOREIGN_LONG, ("prose", False): PROSE,
    ("prose", True): PROSE_LONG, ("code", False): CODE, ("concept", False): CONCEPT, ("math", False): MATH,
}


def template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def eligible(template: str, fields: Mapping[str, str]) -> bool:
    if not template_fields(template) <= fields.keys():
        return False
    cats = CATEGORY_FILTER.get(template)
    if cats is not None and fields.get("category") not in cats:
        return False
    return template not in NOUN_ONLY or fields.get("pos") == "noun"


def unit_fields(unit: Unit, rng: random.Random) -> dict[str, str]:
    """The unit's fields plus {text} and the kind-specific generated ones ({buggy}, {claimed})."""
    f = {**unit.fields, "text": unit.text}
    if unit.kind == "code":
        buggy = inject_bug(unit.text, rng)
        if buggy is not None:
            f["buggy"] = buggy
    if unit.kind == "math" and "answer" in f:
        f["claimed"] = claimed_answer(f["answer"], rng)
    return f


def prompts_for(unit: Unit, rng: random.Random, n: int = 1) -> list[tuple[str, str]]:
    """Up to n (task, prompt) pairs for one unit, with distinct tasks drawn by weight."""
    fields = unit_fields(unit, rng)
    table = TABLES[(unit.kind, unit.long)]
    options = {task: [t for t in temps if eligible(t, fields)] for task, (_, temps) in table.items()}
    tasks = [t for t in table if options[t]]
    out: list[tuple[str, str]] = []
    while tasks and len(out) < n:
        task = rng.choices(tasks, weights=[table[t][0] for t in tasks])[0]
        tasks.remove(task)
        template = rng.choice(options[task])
        out.append((task, template.format(**fields)))
    return out


def claimed_answer(answer: str, rng: random.Random) -> str:
    """The right answer half of the time, else a plausible wrong one."""
    if rng.random() < 0.5:
        return answer
    value = float(answer)
    if rng.random() < 0.6:
        wrong = value + rng.choice([-10, -2, -1, 1, 2, 10])
    else:
        wrong = value * rng.choice([2, 0.5])
    return f"{wrong:g}"


SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.And: ast.Or, ast.Or: ast.And,
}


def inject_bug(code: str, rng: random.Random) -> str | None:
    """The code (ast-unparsed) with one operator swapped or one small constant changed; None if impossible."""
    tree = ast.parse(code)
    sites: list[tuple[ast.AST, str, int]] = []  # (node, attribute, index in a list attribute or -1)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sites += [(node, "ops", i) for i, op in enumerate(node.ops) if type(op) in SWAPS]
        elif isinstance(node, ast.BinOp | ast.BoolOp | ast.AugAssign) and type(node.op) in SWAPS:
            sites.append((node, "op", -1))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool) and node.value in (0, 1):
            sites.append((node, "value", -1))
    if not sites:
        return None
    node, attr, i = rng.choice(sites)
    if attr == "ops":
        node.ops[i] = SWAPS[type(node.ops[i])]()
    elif attr == "op":
        node.op = SWAPS[type(node.op)]()
    else:
        node.value = (not node.value) if isinstance(node.value, bool) else 1 - node.value
    return ast.unparse(tree)
