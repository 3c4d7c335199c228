"""Count the words of a text file: python wordcount.py FILE"""
import sys


def count_words(text):
    return len(text.splitlines())


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(count_words(f.read()))
