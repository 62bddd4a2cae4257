"""Load a tuned schedule and generate: the README's snippet as a runnable script.

python examples/generate_with_schedule.py [runs/smollm2-135m-qa-stages/recommended.json]
"""

import sys

from lazyllm import LazyLLM, Schedule, load_model

model, tokenizer = load_model("smollm2-135m")
schedule = Schedule.load(sys.argv[1]) if len(sys.argv) > 1 else Schedule.paper_style("smollm2-135m", 30)
llm = LazyLLM(model, schedule, tokenizer=tokenizer)
story = " ".join(["The harbour town kept its lighthouse lit every night of the year."] * 40)
result = llm.generate(story + "\nWhat did the town keep lit?", max_new_tokens=32, chat=True)
print(result.text)
print(
    f"TTFT {result.ttft_s:.2f} s, {100 * result.prompt_computed_fraction:.0f}% of prompt (token, layer) pairs computed"
)
