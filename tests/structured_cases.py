"""Constraints the structured-output tests share: 10 JSON schemas (nested objects, arrays, enums, bounded numbers,
required and optional fields, patterned strings), each with a prompt that invites it, and regex and choice cases.
Every constrained output must parse and validate against its schema (jsonschema), whatever path produced it."""

from __future__ import annotations

SCHEMAS: list[tuple[str, dict, str]] = [   # (name, schema, prompt)
    ("person", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False},
     "Describe a person as JSON with a name and an age."),
    ("city_enum", {"type": "object", "properties": {"city": {"enum": ["Paris", "London", "Rome", "Berlin"]},
                                                    "country": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False},
     "Which European capital is the most beautiful? Answer as JSON."),
    ("nested", {"type": "object", "properties": {
        "book": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 40},
            "author": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 20},
                                                        "last": {"type": "string", "maxLength": 20}},
                       "required": ["first", "last"], "additionalProperties": False}},
                 "required": ["title", "author"], "additionalProperties": False}},
                "required": ["book"], "additionalProperties": False},
     "Name a famous book and its author as JSON."),
    ("array_of_strings", {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}},
                          "required": ["colors"], "additionalProperties": False},
     "List a few colors of the rainbow as JSON."),
    ("bounded_number", {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -50, "maximum": 60},
        "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"], "additionalProperties": False},
     "What is a typical summer temperature in Madrid? Answer as JSON."),
    ("optional_fields", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 30}, "year": {"type": "integer", "minimum": 1800, "maximum": 2030},
        "genre": {"type": "string", "maxLength": 15}}, "required": ["title"], "additionalProperties": False},
     "Tell me about a movie you like, as JSON."),
    ("pattern", {"type": "object", "properties": {
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "event": {"type": "string", "maxLength": 30}}, "required": ["date", "event"], "additionalProperties": False},
     "Name a historical event and its date (YYYY-MM-DD) as JSON."),
    ("array_of_objects", {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 15},
                                             "price": {"type": "number", "minimum": 0, "maximum": 1000}},
            "required": ["name", "price"], "additionalProperties": False}}},
                          "required": ["items"], "additionalProperties": False},
     "Write a short shopping list with prices as JSON."),
    ("boolean_and_integer", {"type": "object", "properties": {
        "is_prime": {"type": "boolean"}, "number": {"type": "integer", "minimum": 2, "maximum": 100}},
                             "required": ["number", "is_prime"], "additionalProperties": False},
     "Pick a number between 2 and 100 and say whether it is prime, as JSON."),
    ("top_level_array", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                         "minItems": 3, "maxItems": 5},
     "Give me a few single digits as a JSON array."),
]

REGEXES: list[tuple[str, str]] = [      # (regex, prompt): the whole output must match; every repetition is
    # bounded, so each can complete within a few tokens (an unbounded `+` may run to max_tokens: a "length" finish)
    (r"[0-9]{3}-[0-9]{4}", "My phone number is "),
    (r"(yes|no)", "Is the sky blue? "),
    (r"[A-Z][a-z]{2,10}", "The name of the capital of France is "),
    (r"[0-9]{1,3}", "The number of days in a week is "),
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "Today's date is "),
    (r"(red|green|blue)", "My favourite colour is "),
    (r"[a-z]{2,8}@[a-z]{2,8}\.(com|org)", "Her email address is "),
    (r"#[0-9a-f]{6}", "The colour code is "),
    (r"[A-Z]{3}", "The airport code for London Heathrow is "),
    (r"(true|false)", "Water boils at 100 degrees Celsius: "),
    (r"[0-9]{1,4}\.[0-9]{2}", "The price is $"),
    (r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun)", "The first day of the week is "),
    (r"[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}", "The author of Hamlet is "),
    (r"[0-9]{2}:[0-9]{2}", "The meeting starts at "),
    (r"(north|south|east|west)", "The sun rises in the "),
    (r"[a-z]{3,8}", "A word that rhymes with cat: "),
    (r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "Call us at "),
    (r"v[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}", "The latest version is "),
    (r"[0-9]{1,2} (apples|pears)", "In the basket there are "),
    (r"https://[a-z]+\.[a-z]{2,3}", "Visit our website at "),
]

CHOICES: list[tuple[list[str], str]] = [   # (choices, prompt)
    (["yes", "no"], "Is Paris the capital of France? Answer: "),
    (["positive", "negative", "neutral"], "The sentiment of 'I love this film' is "),
    (["Paris", "London", "Berlin"], "The capital of Germany is "),
    (["red", "green", "blue"], "The colour of grass is "),
    (["cat", "dog", "fish"], "The animal that barks is a "),
    (["1", "2", "3", "4"], "How many legs does a bird have? "),
    (["spring", "summer", "autumn", "winter"], "The coldest season is "),
    (["A", "B", "C", "D"], "Multiple choice: 2 + 2 = ? A) 3 B) 4 C) 5 D) 6. Answer: "),
    (["true", "false"], "The earth is flat: "),
    (["Python", "Rust", "C"], "A language with a borrow checker: "),
    (["hot", "cold"], "Ice is "),
    (["up", "down"], "Things fall "),
    (["Monday", "Friday", "Sunday"], "The day after Saturday is "),
    (["apple", "banana", "cherry"], "A yellow fruit: "),
    (["north", "south"], "Penguins live mostly in the "),
    (["small", "large"], "An elephant is "),
    (["English", "French", "German"], "People in Paris speak "),
    (["day", "night"], "The moon shines at "),
    (["left", "right"], "Turn "),
    (["alpha", "beta", "gamma", "delta"], "The first letter of the Greek alphabet is "),
]
