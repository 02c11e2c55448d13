"""What a compile child and the tuner that started it agree on (`tuner.backends.child`,
`tuner.backends.isolation`), kept apart so neither imports the other."""

# Marks a served child's answers on stdout: whatever else a converter prints there is skipped.
ANSWER = "fxtune-child-answer "
