"""Structured-output requests shared by the end-to-end tests and the grammar acceptance benchmark.

Each case is a prompt and a grammar. A complete output of a regex case matches the regex itself (the
patterns use only syntax Python's ``re`` reads the same way); an EBNF case carries an equivalent
Python regex. Schemas bound their strings so an answer fits in a few dozen tokens.
"""

from __future__ import annotations

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20},
    "population_millions": {"type": "number"}},
    "required": ["city", "country"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {
    "answer": {"type": "integer"}, "confident": {"type": "boolean"}}, "required": ["answer", "confident"],
    "additionalProperties": False}
COLORS = {"type": "object", "properties": {
    "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue", "yellow",
                                                                     "black", "white"]},
               "minItems": 1, "maxItems": 3}}, "required": ["colors"], "additionalProperties": False}

# (prompt, schema): through the OpenAI chat API with response_format json_schema
JSON_CASES = [
    ("Invent a person and give their name and age as JSON.", PERSON),
    ("Describe a famous scientist as JSON with name and age.", PERSON),
    ("Name the capital of France as JSON.", CITY),
    ("Name the largest city in Japan as JSON.", CITY),
    ("Give a city in Brazil as JSON.", CITY),
    ("What is 17 + 25? Answer as JSON.", ANSWER),
    ("How many legs does a spider have? Answer as JSON.", ANSWER),
    ("List the colors of the French flag as JSON.", COLORS),
]
# (prompt, regex, python regex for validation): through /generate
REGEX_CASES = [
    ("What is today's date? Answer as YYYY-MM-DD.", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    ("Give a US phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("Is the sky blue? Answer yes or no.", r"(yes|no)"),
    ("Give an IPv4 address of a home router.", r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"),
    ("Name a planet of the solar system.", r"[A-Z][a-z]+"),
    ("Write a short sentence about cats.", r"[A-Z][a-z ,]{5,60}\."),
    ("Give an email address for a support desk.", r"[a-z]{2,12}@[a-z]{2,12}\.(com|org|net)"),
    ("What time is noon in 24-hour format?", r"[0-2][0-9]:[0-5][0-9]"),
]
# (prompt, EBNF, python regex for validation): through /generate
EBNF_CASES = [
    ("What is 6 times 7?", 'root ::= "The answer is " [0-9]+ "."', r"The answer is [0-9]+\."),
    ("Pick a fruit.", 'root ::= "I pick " fruit "."\nfruit ::= "apple" | "banana" | "cherry"',
     r"I pick (apple|banana|cherry)\."),
    ("Count to three.", 'root ::= num ", " num ", " num\nnum ::= [0-9]+', r"[0-9]+, [0-9]+, [0-9]+"),
    ("Is water wet? Reply with a verdict.", 'root ::= ("Yes" | "No") ", because " [a-z ]{3,40} "."',
     r"(Yes|No), because [a-z ]{3,40}\."),
    ("Give a color and a number.", 'root ::= color " " [0-9]{1,3}\ncolor ::= "red" | "green" | "blue"',
     r"(red|green|blue) [0-9]{1,3}"),
]
