"""``window: cost``'s fixed inputs: the calibration captions and the grid of L (``calibration`` measures τ(L) on
them; ``loop`` bounds ``policy.calibration_images`` by their number)."""

CALIBRATION_PROMPTS = (
    "a small yellow square on a plain white background",
    "a small green circle left of a small yellow square on a striped purple background",
    "a large red square on a checkered orange background",
    "a small black square above a large black square on a striped blue background",
    "a small orange circle on a gradient purple background",
    "a large green square left of a large purple square on a checkered yellow background",
    "a large red square on a plain blue background",
    "a large black triangle above a small red circle on a checkered yellow background",
    "a large orange triangle on a noisy green background",
    "a large black triangle above a small black square on a noisy yellow background",
    "a large yellow triangle on a plain black background",
    "a small purple triangle above a small red triangle on a checkered green background",
    "a large blue square on a gradient white background",
    "a small purple square above a small orange triangle on a checkered blue background",
    "a small red square on a checkered yellow background",
    "a large black triangle below a large white square on a plain purple background",
    "a large purple triangle on a gradient white background",
    "a large white square below a small red triangle on a gradient orange background",
    "a small white circle on a gradient purple background",
    "a small white triangle right of a small orange square on a noisy red background",
    "a small blue triangle on a checkered orange background",
    "a small yellow circle above a large black triangle on a noisy orange background",
    "a small yellow square on a striped blue background",
    "a small green circle below a small red square on a gradient black background",
    "a large blue square on a checkered black background",
    "a small green square below a large red triangle on a noisy purple background",
    "a small black triangle on a striped blue background",
    "a large blue triangle right of a small white circle on a gradient black background",
    "a small purple circle on a noisy black background",
    "a small orange square below a large yellow circle on a striped green background",
    "a large red triangle on a plain purple background",
    "a small orange circle right of a large orange circle on a striped red background",
    "a small green triangle on a noisy red background",
    "a large red triangle left of a large purple square on a plain yellow background",
    "a small purple triangle on a striped blue background",
    "a large yellow triangle left of a large orange triangle on a checkered white background",
    "a large red circle on a noisy blue background",
    "a small blue square above a large orange square on a plain white background",
    "a small white circle on a noisy black background",
    "a small green circle below a large green square on a striped yellow background",
    "a small purple square on a plain red background",
    "a small orange circle right of a small green triangle on a noisy black background",
    "a large green square on a plain red background",
    "a small yellow triangle above a small purple triangle on a checkered orange background",
    "a large black circle on a noisy yellow background",
    "a large red circle above a large black square on a plain purple background",
    "a large orange triangle on a striped blue background",
    "a large white circle left of a large purple square on a plain orange background",
)
"""Fixed captions decoded by ``calibrate_window`` (the first ``policy.calibration_images`` of them): the first 24
one-object and 24 two-object captions of the mini model's training split (``scenes.iter_split(1, "train", …)``; none
held out), alternating; any text model reads them as captions. τ(L) varies much from image to image (on the mini
model its standard error is ≈ 15 % of τ(L) over 6 images, 4–8 % over 24, 2–5 % over 48): the number of images sets
how well L is chosen."""
CALIBRATION_GRID = (4, 6, 8, 12, 16, 20, 24, 32, 48, 64)
