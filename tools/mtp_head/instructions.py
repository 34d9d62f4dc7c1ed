"""The instruction set the default model answers for the training data.

Written for this tool (no downloaded data set): templates in eleven kinds
of request -- explanations, how-to steps, creative writing, lists,
comparisons, code, arithmetic word problems, advice, rewriting, short
factual questions, summaries of given text -- filled with topics from the
lists below. The set is a deterministic function of SEED; every instruction
gets a split from a hash of its text (10% `eval`, never used in training).
"""

import hashlib
import random

SEED = 20261130

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "inflation", "vaccines",
    "the French Revolution", "machine learning", "plate tectonics", "the immune system",
    "climate change", "the stock market", "quantum computing", "the Roman Empire",
    "DNA", "electric cars", "the internet", "recycling", "volcanoes", "the moon landing",
    "solar panels", "sleep", "meditation", "the printing press", "honeybees",
    "coral reefs", "supply and demand", "the Renaissance", "antibiotics", "rainbows",
    "gravity", "blockchain", "the human heart", "earthquakes", "compound interest",
    "the Great Wall of China", "jazz music", "the Olympic Games", "chess", "coffee",
    "bread baking", "gardening", "public speaking", "time management", "the ocean tides",
    "nuclear energy", "wind turbines", "democracy", "the periodic table", "evolution",
    "dinosaurs", "the Silk Road", "the solar system", "batteries", "3D printing",
    "social media", "cloud computing", "video games", "volunteering", "bicycles",
    "the Amazon rainforest", "deserts", "glaciers", "hurricanes", "the brain",
    "exercise", "nutrition", "friendship", "learning a language", "photography",
    "the history of writing", "ancient Egypt", "the Industrial Revolution", "penguins",
    "elephants", "octopuses", "mushrooms", "tea", "chocolate", "pizza", "libraries",
    "museums", "trains", "airplanes", "submarines", "satellites", "telescopes",
    "microscopes", "robots", "smartphones", "passwords", "encryption", "open source software",
]

THINGS = [
    "a lighthouse", "a lost cat", "an old clock", "a rainy afternoon", "a mountain village",
    "the first day of spring", "a robot learning to paint", "a dragon who fears fire",
    "a friendly ghost", "the city at night", "a small boat", "a forgotten letter",
    "a garden in winter", "a library after closing time", "two rival chefs", "a time traveler",
    "the last tree on an island", "a curious fox", "a broken umbrella", "a busy train station",
]

TASKS = [
    "reverse a string", "check whether a number is prime", "count the words in a sentence",
    "find the largest number in a list", "read a file line by line", "sort a list of names",
    "compute the factorial of a number", "remove duplicates from a list",
    "convert Celsius to Fahrenheit", "check whether a word is a palindrome",
    "merge two sorted lists", "compute the average of a list", "find the Fibonacci numbers below 100",
    "count how often each letter appears", "validate an email address",
]

LANGS = ["Python", "JavaScript", "Rust", "C", "Java", "Go", "SQL", "Bash"]

SKILLS = [
    "cook rice", "change a flat tire", "write a cover letter", "start running",
    "plant tomatoes", "save money each month", "study for an exam", "make a budget",
    "clean a laptop keyboard", "prepare for a job interview", "brew tea", "tie a tie",
    "organize a closet", "take better photos with a phone", "learn to juggle",
    "write a thank-you note", "back up my files", "improve my handwriting",
]

PASSAGES = [
    "The committee met on Tuesday to discuss the new park. Residents asked for more trees, "
    "a playground and better lighting. The mayor promised a plan by the end of the month.",
    "Many people drink coffee every morning. It contains caffeine, which can make people feel "
    "more awake. Too much coffee, however, can cause trouble sleeping.",
    "The bridge was closed for repairs after inspectors found cracks in two of its supports. "
    "Traffic was redirected through the old town, and the work should take six weeks.",
    "Our team finished the project two days early. The client liked the design but asked for "
    "a darker color scheme and a larger logo on the front page.",
    "Bees visit flowers to collect nectar and pollen. While doing so they carry pollen from one "
    "flower to another, which helps plants produce fruit and seeds.",
]

ROLES = ["a child", "a beginner", "a busy manager", "a high school student", "an expert"]

TEMPLATES = {
    "explain": [
        "Explain {topic} in simple terms.", "What is {topic}?", "How does {topic} work?",
        "Explain {topic} to {role}.", "Why is {topic} important?",
        "Give me a short introduction to {topic}.", "What are the main ideas behind {topic}?",
    ],
    "howto": [
        "How do I {skill}?", "Give me step-by-step instructions to {skill}.",
        "What is the best way to {skill}?", "I want to {skill}. Where should I start?",
    ],
    "creative": [
        "Write a short poem about {thing}.", "Write a short story about {thing}.",
        "Write a haiku about {topic}.", "Describe {thing} in a few sentences.",
        "Write a limerick about {thing}.", "Write the opening paragraph of a novel about {thing}.",
    ],
    "list": [
        "List five facts about {topic}.", "Give me three tips about {topic}.",
        "What are some common misconceptions about {topic}?",
        "List the pros and cons of {topic}.", "Name four interesting things about {topic}.",
    ],
    "compare": [
        "Compare {topic} and {topic2}.", "What is the difference between {topic} and {topic2}?",
        "Which is more interesting, {topic} or {topic2}? Explain why.",
    ],
    "code": [
        "Write a {lang} function to {task}.", "How do I {task} in {lang}?",
        "Show me {lang} code that can {task}, with a short explanation.",
    ],
    "math": [
        "If I have {a} apples and give away {b}, how many are left?",
        "A train travels {a} kilometers in {b} hours. What is its average speed?",
        "What is {a} plus {b}?", "What is {a} times {b}?",
        "A shirt costs {a} dollars and is on sale for {b} percent off. What is the new price?",
        "I save {b} dollars a week. How many weeks until I have {a} dollars?",
    ],
    "advice": [
        "I feel nervous about {skill2}. Any advice?", "How can I get better at {skill2}?",
        "What should I know before I {skill}?", "Can you give me advice on {topic}?",
    ],
    "rewrite": [
        "Rewrite this sentence to be more formal: {sentence}",
        "Make this sentence simpler: {sentence}", "Correct the grammar: {sentence}",
        "Translate into plain English: {sentence}",
    ],
    "facts": [
        "Who invented {invention}?", "When did {event} happen?", "Where is {place}?",
        "What is the capital of {country}?", "How big is {place}?",
    ],
    "summarize": [
        "Summarize this text in one sentence: {passage}",
        "What is the main point of this paragraph? {passage}",
        "Give this text a title: {passage}",
    ],
}

SENTENCES = [
    "me and him goes to the store yesterday", "the report are finished and we is happy",
    "can u send me the files asap", "this movie was super good and i liked it a lot",
    "their going to the park later if it dont rain", "i has three cats and one dog",
]
INVENTIONS = ["the telephone", "the light bulb", "the printing press", "the airplane",
              "the World Wide Web", "penicillin", "the steam engine", "the bicycle"]
EVENTS = ["the French Revolution", "the first moon landing", "the fall of the Berlin Wall",
          "the signing of the Declaration of Independence", "World War I"]
PLACES = ["Mount Everest", "the Sahara Desert", "the Amazon River", "Australia", "Lake Baikal",
          "the Pacific Ocean", "Greenland", "Iceland"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Kenya", "Australia", "India", "Egypt",
             "Mexico", "Norway", "Italy", "Argentina"]
SKILLS2 = ["public speaking", "meeting new people", "job interviews", "exams",
           "writing", "drawing", "cooking", "swimming", "math"]


def fill(t, rng):
    topic, topic2 = rng.sample(TOPICS, 2)
    return t.format(
        topic=topic, topic2=topic2, thing=rng.choice(THINGS), task=rng.choice(TASKS),
        lang=rng.choice(LANGS), skill=rng.choice(SKILLS), skill2=rng.choice(SKILLS2),
        passage=rng.choice(PASSAGES), role=rng.choice(ROLES), a=rng.randint(12, 480),
        b=rng.randint(2, 11), sentence=rng.choice(SENTENCES), invention=rng.choice(INVENTIONS),
        event=rng.choice(EVENTS), place=rng.choice(PLACES), country=rng.choice(COUNTRIES),
    )


def split_of(text):
    return "eval" if hashlib.sha256(text.encode()).digest()[0] < 26 else "train"


def instructions(n):
    """Up to `n` distinct instructions, at most n / 11 of each kind (kinds
    with few combinations give fewer): [(kind, text, split)]."""
    rng = random.Random(SEED)
    kinds = sorted(TEMPLATES)
    quota = n // len(kinds)
    count = dict.fromkeys(kinds, 0)
    seen, out = set(), []
    for i in range(50 * n):
        kind = kinds[i % len(kinds)]
        if count[kind] >= quota:
            continue
        text = fill(rng.choice(TEMPLATES[kind]), rng)
        if text in seen:
            continue
        seen.add(text)
        count[kind] += 1
        out.append((kind, text, split_of(text)))
    return out
