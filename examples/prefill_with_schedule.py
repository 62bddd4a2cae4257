"""Load a schedule and run a pruned prefill: the README snippet as a runnable script.

python examples/prefill_with_schedule.py [schedule.json]
"""

import sys

from lazyllm import LazyLLM, Schedule, load_model

model, tokenizer = load_model("smollm2-135m")
schedule = Schedule.load(sys.argv[1]) if len(sys.argv) > 1 else Schedule.paper_style("smollm2-135m", 30)
text = " ".join(["The meeting was moved to Thursday because the hall was booked."] * 60)
ids = tokenizer(text + " The meeting was moved to", return_tensors="pt")["input_ids"]
result = LazyLLM(model, schedule).prefill(ids)
print(
    f"next token {tokenizer.decode(result.next_token())!r}; {100 * result.prompt_computed_fraction:.1f}% of tokens computed"
)
