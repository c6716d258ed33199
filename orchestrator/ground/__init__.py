"""The ground floor: small leaf modules every part uses (text shown safely and JSON lines, deadlines in a
child process). They import nothing of ours, so anything may import them."""
