"""The speculative-decoding benchmark's workloads, as chat messages.

`quoting`: a shopping assistant's prompts, two product descriptions and a customer review of each,
asking for each product's details and review quoted word for word and then the comparison (the shape
of a shopping assistant's answer: product names, specifications, the reviewers' own words, then a
recommendation), so the answer repeats the prompt (what prompt lookup can draft). `comparing`: the same
products with only the question, whose answers compare them in the model's own words. `free`: prompts
whose answers do not repeat the prompt (a story, an explanation, a list of ideas). Written for this
benchmark; the products and reviews are invented. How much of SmolLM2's answers each quotes:
docs/benchmarks.md, "Speculative decoding" (`python -m bench.engine.spec_proposers --sweep`).
"""

from __future__ import annotations

SYSTEM = "You are a helpful shopping assistant. Answer using the product details and reviews given."
# The quoting workload's instruction, in the system prompt and again after the products.
QUOTE_SYSTEM = SYSTEM + " Quote the product details and the reviews word for word."
QUOTE_ASK = "First quote the details and the review of Product 1 exactly, then those of Product 2, then answer: "

_PRODUCTS = [
    (
        "TrailPeak 40L Hiking Backpack: 40 litre main compartment, aluminium frame, rain cover included, "
        "weighs 1.4 kg, hip belt with two zip pockets, price 89 dollars.",
        "Review of TrailPeak 40L: The aluminium frame carried a heavy load comfortably on a three day hike. "
        "The rain cover kept everything dry. The hip belt pockets are too small for a phone.",
        "SummitLite 38L Hiking Backpack: 38 litre main compartment, frameless design, no rain cover, "
        "weighs 0.9 kg, roll-top closure, price 119 dollars.",
        "Review of SummitLite 38L: Very light and the roll-top closure is waterproof. Without a frame it "
        "gets uncomfortable above 10 kg. Worth it for fast and light trips.",
        "Compare the TrailPeak 40L and the SummitLite 38L for a three day hike with a heavy load.",
    ),
    (
        "BrewMaster Pro Coffee Maker: 12 cup glass carafe, programmable timer, keep-warm plate for 2 hours, "
        "permanent gold-tone filter, price 59 dollars.",
        "Review of BrewMaster Pro: The programmable timer means coffee is ready when I wake up. The keep-warm "
        "plate makes the coffee taste burnt after an hour.",
        "ThermaBrew Coffee Maker: 10 cup thermal stainless steel carafe, programmable timer, no warming "
        "plate, paper filters, price 79 dollars.",
        "Review of ThermaBrew: The thermal stainless steel carafe keeps coffee hot for four hours without "
        "burning it. Paper filters are an extra cost.",
        "Which coffee maker should I buy if I drink coffee slowly over the morning, the BrewMaster Pro or the "
        "ThermaBrew?",
    ),
    (
        "AquaPure Water Filter Pitcher: 2.4 litre capacity, filter lasts 150 litres or about two months, "
        "reduces chlorine and lead, price 32 dollars.",
        "Review of AquaPure: The water tastes much better than tap water and the pitcher fits in the fridge "
        "door. The filter indicator stopped working after a month.",
        "ClearFlow Water Filter Pitcher: 3.5 litre capacity, filter lasts 100 litres or about six weeks, "
        "reduces chlorine only, price 25 dollars.",
        "Review of ClearFlow: The large 3.5 litre capacity is great for a family. The filter lasts only six "
        "weeks and does not remove lead.",
        "Compare the AquaPure and the ClearFlow water filter pitchers for a family worried about lead.",
    ),
    (
        "NovaBook 14 Laptop: 14 inch display, 16 GB memory, 512 GB storage, battery life up to 12 hours, "
        "weighs 1.3 kg, price 899 dollars.",
        "Review of NovaBook 14: Battery life is close to 12 hours for writing and browsing. The keyboard is "
        "comfortable. The speakers are quiet.",
        "Vertex 15 Laptop: 15.6 inch display, 32 GB memory, 1 TB storage, battery life up to 7 hours, "
        "weighs 2.1 kg, price 1099 dollars.",
        "Review of Vertex 15: The 32 GB memory handles video editing well. At 2.1 kg it is heavy to carry "
        "and the battery lasts only about six hours.",
        "I travel a lot and mostly write documents. Should I buy the NovaBook 14 or the Vertex 15?",
    ),
]

_FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a rainbow forms, in simple words for a child.",
    "Give me five ideas for a birthday party for a ten year old.",
    "Describe a walk through a forest in autumn.",
    "Why do cats purr? Explain briefly.",
    "Write a poem about the sea at night.",
    "What are some good habits for getting better sleep?",
    "Tell me about the history of bicycles in a few sentences.",
]


def _products(system: str, ask: str) -> list[list[dict]]:
    out = []
    for a, ra, b, rb, question in _PRODUCTS:
        body = f"Product 1. {a}\n{ra}\n\nProduct 2. {b}\n{rb}\n\n{ask}{question}"
        out.append([{"role": "system", "content": system}, {"role": "user", "content": body}])
    return out


def quoting_messages() -> list[list[dict]]:
    """Chat messages asking for each product's details and review quoted, then the answer."""
    return _products(QUOTE_SYSTEM, QUOTE_ASK)


def comparing_messages() -> list[list[dict]]:
    """The same products and questions without the request to quote: answers in the model's words."""
    return _products(SYSTEM, "")


def free_messages() -> list[list[dict]]:
    """Chat messages whose answers do not repeat their prompts."""
    return [[{"role": "user", "content": text}] for text in _FREE]
