import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
first = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
print(sys.argv[1], "vs", sys.argv[2], ":", sum(f is None for f in first), "of", len(a), "identical; first differing index:", [f for f in first if f is not None])
