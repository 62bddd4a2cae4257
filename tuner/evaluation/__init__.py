"""Running the model on examples: answers and their scores, the drift (KL) of a schedule, the losses, peers at matched speed."""
