"""synth_mc_task.py — writes a local lm-evaluation-harness multiple-choice task
(a YAML and its JSONL splits) of synthetic questions, for benchmarks and tests
that must run offline: arithmetic, number sequences, comparisons, antonyms,
capitals, plurals, first letters, weekdays, months, animal classes. Every
question has 4 choices in a shuffled order; the same seed gives the same files.

    python python/synth_mc_task.py DIR [--test N] [--train N] [--seed S] [--name NAME]
"""
import argparse
import json
import os
import random

ANTONYMS = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("happy", "sad"), ("light", "dark"),
            ("early", "late"), ("full", "empty"), ("hard", "soft"), ("high", "low"), ("long", "short"),
            ("old", "new"), ("open", "closed"), ("rich", "poor"), ("strong", "weak"), ("thick", "thin"),
            ("wet", "dry"), ("loud", "quiet"), ("clean", "dirty"), ("heavy", "light"), ("near", "far"),
            ("up", "down"), ("inside", "outside"), ("win", "lose"), ("buy", "sell"), ("push", "pull"),
            ("begin", "end"), ("true", "false"), ("above", "below"), ("friend", "enemy"), ("day", "night")]
CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Egypt", "Cairo"), ("Russia", "Moscow"),
            ("China", "Beijing"), ("India", "New Delhi"), ("Greece", "Athens"), ("Norway", "Oslo"),
            ("Sweden", "Stockholm"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Austria", "Vienna"),
            ("Poland", "Warsaw"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
            ("Thailand", "Bangkok"), ("Turkey", "Ankara"), ("Cuba", "Havana"), ("Finland", "Helsinki")]
PLURALS = [("mouse", "mice"), ("child", "children"), ("foot", "feet"), ("tooth", "teeth"), ("man", "men"),
           ("woman", "women"), ("goose", "geese"), ("person", "people"), ("box", "boxes"), ("city", "cities"),
           ("leaf", "leaves"), ("knife", "knives"), ("bus", "buses"), ("baby", "babies"), ("wolf", "wolves")]
ANIMALS = {"bird": ["eagle", "sparrow", "owl", "penguin", "parrot", "robin", "swan", "crow"],
           "fish": ["salmon", "trout", "shark", "tuna", "cod", "carp", "herring", "pike"],
           "mammal": ["dog", "horse", "whale", "tiger", "rabbit", "elephant", "bat", "cow"],
           "insect": ["ant", "bee", "beetle", "butterfly", "fly", "wasp", "moth", "cricket"]}
WORDS = ["apple", "banana", "garden", "window", "river", "orange", "pencil", "yellow", "kitchen", "mountain",
         "table", "violin", "engine", "basket", "candle", "forest", "island", "jacket", "lemon", "needle"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def _numbers(rng, answer, spread=10):
    """answer and three distinct wrong numbers near it."""
    wrong = set()
    while len(wrong) < 3:
        w = answer + rng.choice([-1, 1]) * rng.randint(1, spread)
        if w != answer and w >= 0:
            wrong.add(w)
    return str(answer), [str(w) for w in wrong]


def _others(rng, pool, answer, k=3):
    return rng.sample([x for x in pool if x != answer], k)


def _question(rng):
    """(question, right answer, three wrong answers)."""
    kind = rng.randrange(12)
    if kind == 0:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        return ("What is %d plus %d?" % (a, b),) + _numbers(rng, a + b)
    if kind == 1:
        a, b = rng.randint(20, 99), rng.randint(2, 19)
        return ("What is %d minus %d?" % (a, b),) + _numbers(rng, a - b)
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return ("What is %d times %d?" % (a, b),) + _numbers(rng, a * b, 12)
    if kind == 3:
        s, d = rng.randint(1, 30), rng.randint(2, 9)
        seq = ", ".join(str(s + i * d) for i in range(4))
        return ("What number comes next: %s?" % seq,) + _numbers(rng, s + 4 * d, 6)
    if kind == 4:
        nums = rng.sample(range(1, 200), 4)
        return ("Which number is the largest: %s?" % ", ".join(map(str, nums)), str(max(nums)),
                [str(n) for n in nums if n != max(nums)])
    if kind == 5:
        w, a = rng.choice(ANTONYMS)
        if rng.random() < 0.5:
            w, a = a, w
        pool = sorted({x for p in ANTONYMS for x in p} - {w, a})
        return ("What is the opposite of '%s'?" % w, a, rng.sample(pool, 3))
    if kind == 6:
        c, cap = rng.choice(CAPITALS)
        return ("What is the capital of %s?" % c, cap, _others(rng, [x for _, x in CAPITALS], cap))
    if kind == 7:
        s, p = rng.choice(PLURALS)
        wrong = [w for w in (s + "s", s + "es", p + "s", s + "en") if w != p][:3]
        return ("What is the plural of '%s'?" % s, p, wrong)
    if kind == 8:
        w = rng.choice(WORDS)
        letters = [c for c in "abcdefghijklmnopqrstuvwxyz" if c != w[0]]
        return ("What is the first letter of the word '%s'?" % w, w[0], rng.sample(letters, 3))
    if kind == 9:
        i = rng.randrange(7)
        return ("Which day comes after %s?" % DAYS[i], DAYS[(i + 1) % 7], _others(rng, DAYS, DAYS[(i + 1) % 7]))
    if kind == 10:
        i = rng.randrange(12)
        ans = MONTHS[(i + 1) % 12]
        return ("Which month comes after %s?" % MONTHS[i], ans, _others(rng, MONTHS, ans))
    cls = rng.choice(sorted(ANIMALS))
    right = rng.choice(ANIMALS[cls])
    wrong = [rng.choice(ANIMALS[c]) for c in rng.sample([c for c in sorted(ANIMALS) if c != cls], 3)]
    return ("Which of these animals is a %s?" % cls, right, wrong)


def make_items(n, seed):
    """n distinct questions, each {"question", "choices" (4), "label"}."""
    rng = random.Random(seed)
    seen, items = set(), []
    while len(items) < n:
        q, right, wrong = _question(rng)
        if q in seen or len(set(wrong) - {right}) != 3:
            continue  # asked already, or two choices alike
        seen.add(q)
        choices = [right] + list(wrong)
        rng.shuffle(choices)
        items.append({"question": q, "choices": choices, "label": choices.index(right)})
    return items


YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: multiple_choice
training_split: train
fewshot_split: train
test_split: test
num_fewshot: {shots}
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def write_task(out_dir, n_test=500, n_train=50, seed=14, name="kvb_synth_mc", shots=5):
    """Writes NAME.yaml, NAME.train.jsonl, NAME.test.jsonl into out_dir; returns the task name."""
    os.makedirs(out_dir, exist_ok=True)
    items = make_items(n_test + n_train, seed)
    paths = {}
    for split, part in (("train", items[:n_train]), ("test", items[n_train:])):
        paths[split] = os.path.abspath(os.path.join(out_dir, "%s.%s.jsonl" % (name, split)))
        with open(paths[split], "w") as f:
            for it in part:
                f.write(json.dumps(it) + "\n")
    with open(os.path.join(out_dir, name + ".yaml"), "w") as f:
        f.write(YAML.format(name=name, train=json.dumps(paths["train"]), test=json.dumps(paths["test"]),
                            shots=shots))
    return name


def main():
    ap = argparse.ArgumentParser(description="write a synthetic multiple-choice lm_eval task")
    ap.add_argument("dir")
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--train", type=int, default=50)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--name", default="kvb_synth_mc")
    a = ap.parse_args()
    print(write_task(a.dir, a.test, a.train, a.seed, a.name, a.shots))


if __name__ == "__main__":
    main()
