"""Training prompts (the shipped instruction corpus was answered over these), never benchmark data.

Two documented sources, mixed deterministically: passages of the documentation bundled with
Python (`pydoc_data.topics`: summarize / explain / answer / translate tasks over them), and
instructions synthesized from fixed topic lists below (writing, explanations, arithmetic word
problems, translation of simple sentences).
"""

from __future__ import annotations

import random
from pydoc_data.topics import topics

SOURCE = (
    "synthesized: pydoc_data.topics passages (summarize/explain/QA/translate) + instructions "
    "from built-in topic lists (writing, explanations, arithmetic, translation)"
)

FORMS = [
    "short story",
    "poem",
    "blog post",
    "formal email",
    "product description",
    "speech",
    "diary entry",
    "news article",
    "limerick",
    "letter to a friend",
    "recipe",
    "review",
]
SUBJECTS = [
    "a lighthouse keeper",
    "autumn in the mountains",
    "a lost umbrella",
    "learning to swim",
    "a robot that paints",
    "the first day at a new job",
    "a city at night",
    "a garden",
    "a long train journey",
    "an old library",
    "a rainy weekend",
    "a street market",
    "a chess tournament",
    "the ocean",
    "a small bakery",
    "moving to a new country",
    "a volunteer project",
    "a bicycle trip",
    "a music festival",
    "a snowstorm",
]
CONCEPTS = [
    "photosynthesis",
    "inflation",
    "a black hole",
    "vaccination",
    "the water cycle",
    "compound interest",
    "machine learning",
    "plate tectonics",
    "democracy",
    "gravity",
    "a database index",
    "supply and demand",
    "the immune system",
    "climate change",
    "recycling",
    "an electric motor",
    "the internet",
    "a rainbow",
    "evolution",
    "sleep",
]
LANGS = ["French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese"]
SENTENCES = [
    "The weather is nice today.",
    "Where is the train station?",
    "I would like a cup of coffee, please.",
    "My brother works in a hospital.",
    "We are going to the beach tomorrow.",
    "This book is very interesting.",
    "Can you help me find my keys?",
    "The meeting starts at nine o'clock.",
    "She plays the piano every evening.",
    "The children are reading in the garden.",
]
GERMAN = [
    "Das Wetter ist heute schön .",
    "Die Regierung hat neue Steuern angekündigt .",
    "Viele Menschen fahren im Sommer an die Küste .",
    "Der Zug hatte zwei Stunden Verspätung .",
    "Die Preise für Lebensmittel sind im letzten Jahr gestiegen .",
    "Das Museum zeigt eine Ausstellung über moderne Kunst .",
    "Die Schüler lernen in der Schule drei Sprachen .",
    "Der Bürgermeister eröffnete gestern die neue Brücke .",
    "Die Firma will im nächsten Jahr hundert neue Mitarbeiter einstellen .",
    "Nach dem Regen war die Straße gesperrt .",
]
WORKS = [
    "Hamlet",
    "Pride and Prejudice",
    "War and Peace",
    "The Odyssey",
    "Don Quixote",
    "Moby-Dick",
    "The Divine Comedy",
    "Faust",
    "Les Misérables",
    "The Great Gatsby",
]
COUNTRIES = [
    "France",
    "Japan",
    "Brazil",
    "Canada",
    "Egypt",
    "Australia",
    "Norway",
    "Kenya",
    "Mexico",
    "India",
    "Italy",
    "Chile",
]
ITEMS = ["apples", "notebooks", "tickets", "shirts", "pencils", "cups of tea", "books"]


def doc_passages(chars: int) -> list[tuple[str, str]]:
    """(topic, passage) for consecutive `chars`-long chunks of every topic's text."""
    out = []
    for name in sorted(topics):
        text = topics[name]
        for start in range(0, max(len(text) - chars // 2, 1), chars):
            out.append((name, text[start : start + chars].strip()))
    return out


def training_prompts(count: int, seed: int = 0, chars: int = 600) -> list[str]:
    """`count` distinct prompts, the same for the same arguments.

    Example: training_prompts(2) might give ["Write a poem about a garden.", "Summarize ..."].
    """
    rng = random.Random(seed)
    docs = doc_passages(chars)
    makers = [
        lambda: f"Write a {rng.choice(FORMS)} about {rng.choice(SUBJECTS)}.",
        lambda: f"Explain {rng.choice(CONCEPTS)} in simple terms.",
        lambda: f"What is {rng.choice(CONCEPTS)}? Give a short answer and an example.",
        lambda: _math(rng),
        lambda: f"Translate into {rng.choice(LANGS)}: {rng.choice(SENTENCES)}",
        lambda: (
            "Summarize the following documentation in a few sentences:\n\n" + rng.choice(docs)[1]
        ),
        lambda: (
            "Explain the following passage to a beginner, with an example:\n\n"
            + rng.choice(docs)[1]
        ),
        lambda: _doc_question(rng, docs),
        lambda: f"Translate German to English: {rng.choice(GERMAN)} {rng.choice(GERMAN)}",
        lambda: rng.choice(
            [
                f"Who wrote {rng.choice(WORKS)}?",
                f"What is the capital of {rng.choice(COUNTRIES)}?",
                f"What language is spoken in {rng.choice(COUNTRIES)}?",
                f"When was {rng.choice(WORKS)} written?",
            ]
        ),
        lambda: (
            f"Translate the first sentence of this text into {rng.choice(LANGS)}:\n\n"
            + rng.choice(docs)[1][:200]
        ),
    ]
    out: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < count and attempts < 50 * count:
        attempts += 1
        prompt = makers[attempts % len(makers)]()
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.choice([5, 10, 15, 20, 25])
    return rng.choice(
        [
            (
                f"A shop sells {rng.choice(ITEMS)} for ${a} each. How much do {b} of them cost "
                f"after a {c}% discount? Show your steps."
            ),
            f"Solve for x: {a}x + {b} = {a * c + b}. Explain each step.",
            f"A train travels {a * 10} km in {b} hours. What is its average speed?",
            f"What is {a} times {b}, plus {c}? Show the calculation.",
        ]
    )


def _doc_question(rng: random.Random, docs: list[tuple[str, str]]) -> str:
    name, text = rng.choice(docs)
    return (
        f"Answer the question using only the passage.\n\nPassage:\n{text}\n\n"
        f"Question: What does the passage say about {name.replace('-', ' ')}?"
    )
