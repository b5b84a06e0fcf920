"""Extra training prompts for the ``code`` and ``chat`` domains.

- ``CODE_STUBS``: HumanEval-style Python function stubs (signature and docstring with doctest examples, no body)
  written for this project.
- ``CHAT_QUESTIONS``: general-assistant questions and requests (science, history, everyday how-to, short writing
  tasks, advice, comparisons, summaries of well-known stories).

Both sets are for training only and never overlap the evaluation splits in ``specdiff.prompts``: no stub copies a
HumanEval problem and no question touches a held-out chat topic. They exist because the 124 HumanEval and 36
hand-written chat training prompts were too few to distil a drafter from.
"""

from __future__ import annotations

CODE_STUBS: tuple[str, ...] = (
    '''\
def reverse_words(sentence: str) -> str:
    """ Return the sentence with its words in reverse order. Words are separated by single spaces.
    >>> reverse_words('the quick brown fox')
    'fox brown quick the'
    >>> reverse_words('hello')
    'hello'
    """
''',
    '''\
def count_vowels(text: str) -> int:
    """ Count how many vowels (a, e, i, o, u) appear in the text, ignoring case.
    >>> count_vowels('Hello World')
    3
    >>> count_vowels('rhythm')
    0
    >>> count_vowels('AEIOU')
    5
    """
''',
    '''\
def is_sentence_palindrome(sentence: str) -> bool:
    """ Decide whether a sentence reads the same forwards and backwards.
    Only letters count, and upper and lower case are treated as equal.
    >>> is_sentence_palindrome('Never odd or even')
    True
    >>> is_sentence_palindrome('Was it a car or a cat I saw?')
    True
    >>> is_sentence_palindrome('Hello there')
    False
    """
''',
    '''\
def capitalize_words(text: str) -> str:
    """ Make the first letter of every word upper case and leave the other letters unchanged.
    Words are separated by single spaces.
    >>> capitalize_words('the old man and the sea')
    'The Old Man And The Sea'
    >>> capitalize_words('iPhone sales grew')
    'IPhone Sales Grew'
    """
''',
    '''\
def run_length_encode(text: str) -> str:
    """ Compress a string with run-length encoding: every run of a repeated character
    is written as the character followed by the length of the run.
    >>> run_length_encode('aaabccdddd')
    'a3b1c2d4'
    >>> run_length_encode('')
    ''
    >>> run_length_encode('xyz')
    'x1y1z1'
    """
''',
    '''\
def run_length_decode(encoded: str) -> str:
    """ Undo run-length encoding. The input is a sequence of letters, each followed by
    a positive number telling how many times the letter repeats.
    >>> run_length_decode('a3b1c2')
    'aaabcc'
    >>> run_length_decode('x10')
    'xxxxxxxxxx'
    >>> run_length_decode('')
    ''
    """
''',
    '''\
def caesar_cipher(text: str, shift: int) -> str:
    """ Encrypt the text with a Caesar cipher: every lowercase letter is moved `shift` places
    forward in the alphabet, wrapping around from 'z' to 'a'. Other characters stay the same.
    >>> caesar_cipher('abc', 1)
    'bcd'
    >>> caesar_cipher('hello, world', 3)
    'khoor, zruog'
    >>> caesar_cipher('xyz', 2)
    'zab'
    """
''',
    '''\
def is_anagram(first: str, second: str) -> bool:
    """ Return True if the two words use exactly the same letters the same number of times,
    ignoring case.
    >>> is_anagram('listen', 'silent')
    True
    >>> is_anagram('Dusty', 'study')
    True
    >>> is_anagram('apple', 'paper')
    False
    """
''',
    '''\
def longest_word(sentence: str) -> str:
    """ Return the longest word in the sentence. If several words share the greatest length,
    return the one that appears first. Words are separated by spaces.
    >>> longest_word('I love programming in Python')
    'programming'
    >>> longest_word('cat dog bird')
    'bird'
    >>> longest_word('one two six')
    'one'
    """
''',
    '''\
def remove_repeated_chars(text: str) -> str:
    """ Keep only the first occurrence of each character in the string, preserving order.
    >>> remove_repeated_chars('banana')
    'ban'
    >>> remove_repeated_chars('mississippi')
    'misp'
    >>> remove_repeated_chars('abc')
    'abc'
    """
''',
    '''\
def count_overlapping(text: str, pattern: str) -> int:
    """ Count how many times the pattern occurs in the text, including occurrences that overlap.
    >>> count_overlapping('aaaa', 'aa')
    3
    >>> count_overlapping('abababa', 'aba')
    3
    >>> count_overlapping('hello', 'z')
    0
    """
''',
    '''\
def snake_to_camel(name: str) -> str:
    """ Convert a snake_case identifier to camelCase.
    >>> snake_to_camel('user_name')
    'userName'
    >>> snake_to_camel('total_items_in_cart')
    'totalItemsInCart'
    >>> snake_to_camel('id')
    'id'
    """
''',
    '''\
def camel_to_snake(name: str) -> str:
    """ Convert a camelCase identifier to snake_case by putting an underscore before
    every upper case letter and making it lower case.
    >>> camel_to_snake('userName')
    'user_name'
    >>> camel_to_snake('totalItemsInCart')
    'total_items_in_cart'
    >>> camel_to_snake('simple')
    'simple'
    """
''',
    '''\
def is_balanced(expression: str) -> bool:
    """ Check whether the brackets in the expression are balanced. The three kinds of brackets
    are (), [] and {}; every opening bracket must be closed by the matching kind in the right order.
    Characters that are not brackets are ignored.
    >>> is_balanced('(a + b) * [c - d]')
    True
    >>> is_balanced('{[()()]}')
    True
    >>> is_balanced('([)]')
    False
    >>> is_balanced('((')
    False
    """
''',
    '''\
def first_unique_index(text: str) -> int:
    """ Return the index of the first character that appears exactly once in the string,
    or -1 if every character repeats.
    >>> first_unique_index('leetcode')
    0
    >>> first_unique_index('aabbcdd')
    4
    >>> first_unique_index('aabb')
    -1
    """
''',
    '''\
def collapse_spaces(text: str) -> str:
    """ Replace every run of spaces with a single space and remove spaces at both ends.
    >>> collapse_spaces('  too   many    spaces ')
    'too many spaces'
    >>> collapse_spaces('fine as is')
    'fine as is'
    """
''',
    '''\
def make_acronym(phrase: str) -> str:
    """ Build an acronym from the first letter of each word in the phrase, in upper case.
    Words are separated by spaces or hyphens.
    >>> make_acronym('portable network graphics')
    'PNG'
    >>> make_acronym('Complementary metal-oxide semiconductor')
    'CMOS'
    """
''',
    '''\
def is_pangram(sentence: str) -> bool:
    """ Return True if the sentence uses every letter of the English alphabet at least once,
    ignoring case.
    >>> is_pangram('The quick brown fox jumps over the lazy dog')
    True
    >>> is_pangram('Hello world')
    False
    """
''',
    '''\
from typing import Dict


def char_frequency(text: str) -> Dict[str, int]:
    """ Count how often each character occurs in the text. The keys appear in the order
    in which the characters are first seen.
    >>> char_frequency('hello')
    {'h': 1, 'e': 1, 'l': 2, 'o': 1}
    >>> char_frequency('')
    {}
    """
''',
    '''\
from typing import Dict


def word_frequency(text: str) -> Dict[str, int]:
    """ Count how many times each word appears in the text. Words are compared in lower case
    and separated by whitespace; keys keep the order of first appearance.
    >>> word_frequency('the cat and the hat')
    {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
    >>> word_frequency('Go go GO')
    {'go': 3}
    """
''',
    '''\
def mask_card_number(number: str) -> str:
    """ Hide all but the last four digits of a card number by replacing them with '*'.
    Numbers with four or fewer digits are returned unchanged.
    >>> mask_card_number('4539148803436467')
    '************6467'
    >>> mask_card_number('1234')
    '1234'
    """
''',
    '''\
def alternate_case(text: str) -> str:
    """ Return a copy of the text in which the characters alternate between upper and lower
    case, starting with upper case at index 0.
    >>> alternate_case('hello')
    'HeLlO'
    >>> alternate_case('PYTHON')
    'PyThOn'
    """
''',
    '''\
from typing import List


def longest_common_prefix(words: List[str]) -> str:
    """ Find the longest string that every word in the list starts with.
    Return an empty string if the list is empty or the words share no prefix.
    >>> longest_common_prefix(['flower', 'flow', 'flight'])
    'fl'
    >>> longest_common_prefix(['dog', 'racecar', 'car'])
    ''
    >>> longest_common_prefix(['interview', 'internet', 'interval'])
    'inter'
    """
''',
    '''\
from typing import List


def words_starting_with(words: List[str], letter: str) -> List[str]:
    """ Return the words that begin with the given letter, ignoring case, in their original order.
    >>> words_starting_with(['Apple', 'banana', 'avocado', 'cherry'], 'a')
    ['Apple', 'avocado']
    >>> words_starting_with(['one', 'two'], 'z')
    []
    """
''',
    '''\
def truncate_text(text: str, limit: int) -> str:
    """ Shorten the text so that it is at most `limit` characters long. If the text is too long,
    cut it and end it with '...', so that the result including the dots has exactly `limit` characters.
    You may assume limit is at least 3.
    >>> truncate_text('Hello, world!', 8)
    'Hello...'
    >>> truncate_text('Short', 10)
    'Short'
    """
''',
    '''\
def is_hex_color(code: str) -> bool:
    """ Check whether the string is a valid hexadecimal colour code: a '#' followed by
    exactly six characters from 0-9 and a-f (either case).
    >>> is_hex_color('#1a2B3c')
    True
    >>> is_hex_color('#12345')
    False
    >>> is_hex_color('123456')
    False
    >>> is_hex_color('#12g456')
    False
    """
''',
    '''\
def roman_to_int(numeral: str) -> int:
    """ Convert a Roman numeral written with the letters I, V, X, L, C, D and M to an integer.
    A smaller value placed before a larger one is subtracted, as in IV or XC.
    >>> roman_to_int('III')
    3
    >>> roman_to_int('XLII')
    42
    >>> roman_to_int('MCMXCIV')
    1994
    """
''',
    '''\
from typing import Dict


def parse_settings(line: str) -> Dict[str, str]:
    """ Parse a line of settings written as key=value pairs separated by semicolons.
    Spaces around keys and values are removed and empty pairs are skipped.
    >>> parse_settings('host=localhost; port=8080')
    {'host': 'localhost', 'port': '8080'}
    >>> parse_settings('mode=fast;;')
    {'mode': 'fast'}
    >>> parse_settings('')
    {}
    """
''',
    '''\
def time_to_seconds(clock: str) -> int:
    """ Convert a time written as 'HH:MM:SS' into the total number of seconds.
    >>> time_to_seconds('00:01:30')
    90
    >>> time_to_seconds('01:02:03')
    3723
    """
''',
    '''\
def format_duration(seconds: int) -> str:
    """ Format a number of seconds as 'HH:MM:SS', with each part padded to two digits.
    >>> format_duration(90)
    '00:01:30'
    >>> format_duration(3723)
    '01:02:03'
    >>> format_duration(0)
    '00:00:00'
    """
''',
    '''\
from typing import List


def split_csv_line(line: str) -> List[str]:
    """ Split one line of comma-separated values into its fields, removing the spaces
    around each field. Quoted fields do not need to be handled.
    >>> split_csv_line('name, age , city')
    ['name', 'age', 'city']
    >>> split_csv_line('a,,b')
    ['a', '', 'b']
    """
''',
    '''\
def sum_digits_in_text(text: str) -> int:
    """ Add up every digit that appears anywhere in the text. Each digit counts on its own,
    so '12' adds 1 and 2.
    >>> sum_digits_in_text('a1b2c3')
    6
    >>> sum_digits_in_text('room 404')
    8
    >>> sum_digits_in_text('no digits')
    0
    """
''',
    '''\
def is_isogram(word: str) -> bool:
    """ An isogram is a word in which no letter appears more than once, ignoring case.
    Return True if the given word is an isogram.
    >>> is_isogram('lumberjack')
    True
    >>> is_isogram('Alphabet')
    False
    >>> is_isogram('')
    True
    """
''',
    '''\
def rotate_right(text: str, steps: int) -> str:
    """ Rotate the string to the right by the given number of steps: characters that fall off
    the end come back at the start.
    >>> rotate_right('abcdef', 2)
    'efabcd'
    >>> rotate_right('abc', 3)
    'abc'
    >>> rotate_right('abc', 4)
    'cab'
    """
''',
    '''\
def is_rotation(first: str, second: str) -> bool:
    """ Return True if the second string can be obtained by rotating the first one,
    that is, by moving some characters from its front to its back.
    >>> is_rotation('waterbottle', 'erbottlewat')
    True
    >>> is_rotation('abcd', 'acbd')
    False
    >>> is_rotation('abc', 'abc')
    True
    """
''',
    '''\
def most_common_letter(text: str) -> str:
    """ Return the letter that appears most often in the text, ignoring case and any character
    that is not a letter. When there is a tie, return the letter that comes first in the alphabet.
    >>> most_common_letter('Hello World')
    'l'
    >>> most_common_letter('abcabc')
    'a'
    """
''',
    '''\
def reverse_each_word(sentence: str) -> str:
    """ Reverse the letters of every word while keeping the words in their original order.
    >>> reverse_each_word('hello world')
    'olleh dlrow'
    >>> reverse_each_word('a bc def')
    'a cb fed'
    """
''',
    '''\
def count_uppercase(text: str) -> int:
    """ Return the number of upper case letters in the text.
    >>> count_uppercase('Hello World')
    2
    >>> count_uppercase('NASA launched a rocket')
    4
    >>> count_uppercase('quiet')
    0
    """
''',
    '''\
def replace_vowels(text: str, symbol: str) -> str:
    """ Replace every vowel in the text, upper or lower case, with the given symbol.
    >>> replace_vowels('Programming is fun', '*')
    'Pr*gr*mm*ng *s f*n'
    >>> replace_vowels('sky', '#')
    'sky'
    """
''',
    '''\
def binary_to_int(bits: str) -> int:
    """ Convert a string of 0s and 1s to the integer it represents in base 2,
    without using int(bits, 2).
    >>> binary_to_int('101')
    5
    >>> binary_to_int('11111111')
    255
    >>> binary_to_int('0')
    0
    """
''',
    '''\
def int_to_binary(number: int) -> str:
    """ Return the base-2 representation of a non-negative integer as a string of 0s and 1s,
    without a prefix.
    >>> int_to_binary(5)
    '101'
    >>> int_to_binary(0)
    '0'
    >>> int_to_binary(32)
    '100000'
    """
''',
    '''\
from typing import List


def chunk_string(text: str, size: int) -> List[str]:
    """ Cut the text into consecutive pieces of the given size. The last piece may be shorter.
    >>> chunk_string('abcdefgh', 3)
    ['abc', 'def', 'gh']
    >>> chunk_string('abcd', 2)
    ['ab', 'cd']
    >>> chunk_string('', 4)
    []
    """
''',
    '''\
def interleave(first: str, second: str) -> str:
    """ Merge two strings by taking characters from each in turn, starting with the first string.
    When one string runs out, append the rest of the other.
    >>> interleave('abc', '123')
    'a1b2c3'
    >>> interleave('abcde', 'xy')
    'axbycde'
    >>> interleave('', 'hi')
    'hi'
    """
''',
    '''\
def slugify(title: str) -> str:
    """ Turn a title into a URL slug: make it lower case, drop every character that is not a letter,
    a digit or a space, and join the remaining words with hyphens.
    >>> slugify('Hello, World!')
    'hello-world'
    >>> slugify('  10 Tips for Better Code ')
    '10-tips-for-better-code'
    """
''',
    '''\
def is_valid_ipv4(address: str) -> bool:
    """ Check whether the string is a valid IPv4 address: four decimal numbers from 0 to 255
    separated by dots, with no leading zeros (except the number 0 itself).
    >>> is_valid_ipv4('192.168.1.1')
    True
    >>> is_valid_ipv4('256.1.1.1')
    False
    >>> is_valid_ipv4('10.0.01.1')
    False
    >>> is_valid_ipv4('1.2.3')
    False
    """
''',
    '''\
def count_words(text: str) -> int:
    """ Return the number of words in the text. Words are separated by any amount of whitespace.
    >>> count_words('Hello there, how are you?')
    5
    >>> count_words('   ')
    0
    """
''',
    '''\
def add_binary(first: str, second: str) -> str:
    """ Add two binary numbers given as strings and return their sum as a binary string.
    >>> add_binary('11', '1')
    '100'
    >>> add_binary('1010', '1011')
    '10101'
    >>> add_binary('0', '0')
    '0'
    """
''',
    '''\
def hamming_distance(first: str, second: str) -> int:
    """ Given two strings of equal length, count the positions at which their characters differ.
    >>> hamming_distance('karolin', 'kathrin')
    3
    >>> hamming_distance('10110', '10011')
    2
    >>> hamming_distance('same', 'same')
    0
    """
''',
    '''\
def compare_versions(first: str, second: str) -> int:
    """ Compare two version strings made of numbers separated by dots, such as '1.10.2'.
    Return -1 if the first is older, 1 if it is newer and 0 if they are equal.
    Missing parts count as zero, so '1.0' equals '1'.
    >>> compare_versions('1.2', '1.10')
    -1
    >>> compare_versions('2.0.1', '2.0')
    1
    >>> compare_versions('1.0', '1')
    0
    """
''',
    '''\
from typing import Tuple


def count_letters_and_digits(text: str) -> Tuple[int, int]:
    """ Return a tuple with the number of letters and the number of digits in the text.
    >>> count_letters_and_digits('hello123')
    (5, 3)
    >>> count_letters_and_digits('R2-D2!')
    (2, 2)
    """
''',
    '''\
from typing import List


def running_total(numbers: List[int]) -> List[int]:
    """ Return a list in which each element is the sum of all numbers up to and including
    that position in the input.
    >>> running_total([1, 2, 3, 4])
    [1, 3, 6, 10]
    >>> running_total([5, -2, 7])
    [5, 3, 10]
    >>> running_total([])
    []
    """
''',
    '''\
from typing import List


def neighbour_differences(numbers: List[int]) -> List[int]:
    """ For each pair of neighbouring numbers, compute the later one minus the earlier one.
    The result has one element fewer than the input.
    >>> neighbour_differences([1, 4, 9, 16])
    [3, 5, 7]
    >>> neighbour_differences([10, 7])
    [-3]
    >>> neighbour_differences([5])
    []
    """
''',
    '''\
from typing import List


def flatten(nested: List[List[int]]) -> List[int]:
    """ Join a list of lists into one flat list, keeping the order of the elements.
    >>> flatten([[1, 2], [3], [], [4, 5]])
    [1, 2, 3, 4, 5]
    >>> flatten([])
    []
    """
''',
    '''\
from typing import List


def chunk_list(items: List[int], size: int) -> List[List[int]]:
    """ Split the list into consecutive groups of the given size; the last group may be smaller.
    >>> chunk_list([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    >>> chunk_list([1, 2, 3], 3)
    [[1, 2, 3]]
    """
''',
    '''\
from typing import List


def rotate_left(items: List[int], steps: int) -> List[int]:
    """ Rotate the list to the left by the given number of steps and return the new list.
    >>> rotate_left([1, 2, 3, 4, 5], 2)
    [3, 4, 5, 1, 2]
    >>> rotate_left([1, 2, 3], 4)
    [2, 3, 1]
    >>> rotate_left([], 3)
    []
    """
''',
    '''\
from typing import List, Optional


def second_largest(numbers: List[int]) -> Optional[int]:
    """ Return the second largest distinct value in the list, or None if there is no such value.
    >>> second_largest([4, 1, 7, 3, 7])
    4
    >>> second_largest([5, 5, 5])
    >>> second_largest([2, 9])
    2
    """
''',
    '''\
from typing import List


def unique_in_order(items: List[int]) -> List[int]:
    """ Remove duplicate values from the list, keeping the first occurrence of each
    and the original order.
    >>> unique_in_order([3, 1, 3, 2, 1])
    [3, 1, 2]
    >>> unique_in_order([7, 7, 7])
    [7]
    """
''',
    '''\
from typing import List


def find_missing_number(numbers: List[int]) -> int:
    """ The list contains every whole number from 1 to n exactly once, except one that is missing.
    Find the missing number.
    >>> find_missing_number([1, 2, 4, 5])
    3
    >>> find_missing_number([2, 3, 1, 5, 6])
    4
    >>> find_missing_number([1, 2, 3])
    4
    """
''',
    '''\
from typing import List


def move_zeros_to_end(numbers: List[int]) -> List[int]:
    """ Move every zero to the end of the list while keeping the other numbers in their order.
    >>> move_zeros_to_end([0, 1, 0, 3, 12])
    [1, 3, 12, 0, 0]
    >>> move_zeros_to_end([4, 5])
    [4, 5]
    """
''',
    '''\
from typing import List


def merge_sorted(first: List[int], second: List[int]) -> List[int]:
    """ Merge two lists that are already sorted in ascending order into one sorted list,
    without calling sort().
    >>> merge_sorted([1, 3, 5], [2, 4, 6])
    [1, 2, 3, 4, 5, 6]
    >>> merge_sorted([1, 2], [])
    [1, 2]
    >>> merge_sorted([1, 1], [1])
    [1, 1, 1]
    """
''',
    '''\
from typing import List


def binary_search(sorted_items: List[int], target: int) -> int:
    """ Search a list sorted in ascending order for the target using binary search.
    Return the index of the target, or -1 if it is not in the list.
    >>> binary_search([1, 3, 5, 7, 9, 11], 7)
    3
    >>> binary_search([1, 3, 5, 7, 9, 11], 4)
    -1
    >>> binary_search([], 1)
    -1
    """
''',
    '''\
from typing import List


def count_inversions(numbers: List[int]) -> int:
    """ Count the pairs of positions i < j where numbers[i] is greater than numbers[j].
    A sorted list has no inversions.
    >>> count_inversions([2, 4, 1, 3, 5])
    3
    >>> count_inversions([1, 2, 3])
    0
    >>> count_inversions([3, 2, 1])
    3
    """
''',
    '''\
from typing import List


def max_subarray_sum(numbers: List[int]) -> int:
    """ Return the largest sum of any non-empty run of consecutive elements in the list.
    >>> max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4])
    6
    >>> max_subarray_sum([-3, -1, -2])
    -1
    >>> max_subarray_sum([5])
    5
    """
''',
    '''\
from typing import List, Tuple


def two_sum(numbers: List[int], target: int) -> Tuple[int, int]:
    """ Find two different positions whose values add up to the target and return their indices
    as a tuple (smaller index first). You may assume exactly one such pair exists.
    >>> two_sum([2, 7, 11, 15], 9)
    (0, 1)
    >>> two_sum([3, 2, 4], 6)
    (1, 2)
    """
''',
    '''\
from typing import List


def majority_element(numbers: List[int]) -> int:
    """ Return the value that appears more than half the time in the list.
    You may assume that such a value always exists.
    >>> majority_element([3, 2, 3])
    3
    >>> majority_element([2, 2, 1, 1, 1, 2, 2])
    2
    """
''',
    '''\
from typing import List


def transpose(matrix: List[List[int]]) -> List[List[int]]:
    """ Return the transpose of a matrix given as a list of rows: row i of the result
    is column i of the input.
    >>> transpose([[1, 2, 3], [4, 5, 6]])
    [[1, 4], [2, 5], [3, 6]]
    >>> transpose([[7]])
    [[7]]
    """
''',
    '''\
from typing import List


def matrix_multiply(a: List[List[int]], b: List[List[int]]) -> List[List[int]]:
    """ Multiply two matrices given as lists of rows. The number of columns of `a`
    equals the number of rows of `b`.
    >>> matrix_multiply([[1, 2], [3, 4]], [[5, 6], [7, 8]])
    [[19, 22], [43, 50]]
    >>> matrix_multiply([[1, 0, 2]], [[1], [2], [3]])
    [[7]]
    """
''',
    '''\
from typing import List


def diagonal_sum(matrix: List[List[int]]) -> int:
    """ Given a square matrix, return the sum of the elements on its main diagonal,
    from the top-left corner to the bottom-right corner.
    >>> diagonal_sum([[1, 2], [3, 4]])
    5
    >>> diagonal_sum([[5, 0, 0], [0, 5, 0], [0, 0, 5]])
    15
    """
''',
    '''\
from typing import List


def rotate_matrix(matrix: List[List[int]]) -> List[List[int]]:
    """ Rotate a square matrix by 90 degrees clockwise and return the rotated copy.
    >>> rotate_matrix([[1, 2], [3, 4]])
    [[3, 1], [4, 2]]
    >>> rotate_matrix([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    [[7, 4, 1], [8, 5, 2], [9, 6, 3]]
    """
''',
    '''\
from typing import List


def spiral_order(matrix: List[List[int]]) -> List[int]:
    """ Read the elements of a matrix in spiral order: along the top row from left to right,
    down the right column, back along the bottom row, up the left column, and so on inwards.
    >>> spiral_order([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    [1, 2, 3, 6, 9, 8, 7, 4, 5]
    >>> spiral_order([[1, 2], [3, 4], [5, 6]])
    [1, 2, 4, 6, 5, 3]
    """
''',
    '''\
from typing import List


def evens_then_odds(numbers: List[int]) -> List[int]:
    """ Return the even numbers of the list followed by the odd numbers, each group
    keeping its original order.
    >>> evens_then_odds([3, 8, 5, 2, 6, 1])
    [8, 2, 6, 3, 5, 1]
    >>> evens_then_odds([1, 3])
    [1, 3]
    """
''',
    '''\
from typing import List


def longest_increasing_run(numbers: List[int]) -> int:
    """ Return the length of the longest run of consecutive elements in which each element
    is strictly greater than the one before it. An empty list has length 0.
    >>> longest_increasing_run([1, 2, 2, 3, 4, 5, 1])
    4
    >>> longest_increasing_run([5, 4, 3])
    1
    >>> longest_increasing_run([])
    0
    """
''',
    '''\
from typing import Dict, List


def group_by_length(words: List[str]) -> Dict[int, List[str]]:
    """ Group the words by their length. Each key is a length and each value lists the words
    of that length in their original order; keys appear in order of first appearance.
    >>> group_by_length(['cat', 'horse', 'dog', 'mouse', 'ox'])
    {3: ['cat', 'dog'], 5: ['horse', 'mouse'], 2: ['ox']}
    >>> group_by_length([])
    {}
    """
''',
    '''\
from typing import Dict, List


def pair_up(keys: List[str], values: List[int]) -> Dict[str, int]:
    """ Build a dictionary that maps each key to the value at the same position.
    If one list is longer, its extra elements are ignored.
    >>> pair_up(['a', 'b', 'c'], [1, 2, 3])
    {'a': 1, 'b': 2, 'c': 3}
    >>> pair_up(['x', 'y'], [9])
    {'x': 9}
    """
''',
    '''\
from typing import Dict


def invert_dict(mapping: Dict[str, int]) -> Dict[int, str]:
    """ Swap the keys and values of a dictionary whose values are all different.
    >>> invert_dict({'one': 1, 'two': 2})
    {1: 'one', 2: 'two'}
    >>> invert_dict({})
    {}
    """
''',
    '''\
from typing import List


def merge_intervals(intervals: List[List[int]]) -> List[List[int]]:
    """ Given a list of closed intervals [start, end], merge every group of intervals that overlap
    or touch, and return the merged intervals sorted by their start.
    >>> merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]])
    [[1, 6], [8, 10], [15, 18]]
    >>> merge_intervals([[5, 7], [1, 5]])
    [[1, 7]]
    >>> merge_intervals([])
    []
    """
''',
    '''\
from typing import List


def insert_position(sorted_items: List[int], value: int) -> int:
    """ Return the index at which the value should be inserted to keep the sorted list sorted.
    If the value is already present, return the index of its first occurrence.
    >>> insert_position([1, 3, 5, 6], 5)
    2
    >>> insert_position([1, 3, 5, 6], 2)
    1
    >>> insert_position([1, 3, 5, 6], 7)
    4
    """
''',
    '''\
from typing import List


def sort_by_length(words: List[str]) -> List[str]:
    """ Sort the words from shortest to longest. Words of the same length keep their original order.
    >>> sort_by_length(['banana', 'kiwi', 'apple', 'fig'])
    ['fig', 'kiwi', 'apple', 'banana']
    >>> sort_by_length(['bb', 'a', 'cc'])
    ['a', 'bb', 'cc']
    """
''',
    '''\
from typing import List, Tuple


def sort_by_score(results: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """ Each result is a (name, score) pair. Sort the results from the highest score to the lowest;
    results with equal scores are ordered by name alphabetically.
    >>> sort_by_score([('ann', 7), ('bob', 9), ('cid', 7)])
    [('bob', 9), ('ann', 7), ('cid', 7)]
    >>> sort_by_score([])
    []
    """
''',
    '''\
from typing import List


def kth_smallest(numbers: List[int], k: int) -> int:
    """ Return the k-th smallest element of the list, counting from 1. Duplicates count separately.
    >>> kth_smallest([7, 10, 4, 3, 20, 15], 3)
    7
    >>> kth_smallest([5, 1, 1], 2)
    1
    """
''',
    '''\
from typing import List


def median(numbers: List[float]) -> float:
    """ Return the median of a non-empty list. For an even number of elements,
    the median is the mean of the two middle values.
    >>> median([3, 1, 2])
    2
    >>> median([4, 1, 3, 2])
    2.5
    """
''',
    '''\
from typing import List


def most_frequent(numbers: List[int]) -> int:
    """ Return the value that occurs most often in a non-empty list.
    If several values are equally common, return the smallest of them.
    >>> most_frequent([1, 3, 3, 2, 1, 3])
    3
    >>> most_frequent([4, 2, 4, 2])
    2
    """
''',
    '''\
from typing import List


def moving_average(values: List[float], window: int) -> List[float]:
    """ Compute the average of every group of `window` consecutive values,
    sliding the group one position at a time.
    >>> moving_average([1, 2, 3, 4, 5], 3)
    [2.0, 3.0, 4.0]
    >>> moving_average([10, 20], 2)
    [15.0]
    >>> moving_average([1, 2], 3)
    []
    """
''',
    '''\
from typing import List


def cumulative_product(numbers: List[int]) -> List[int]:
    """ Return a list whose i-th element is the product of the first i + 1 numbers of the input.
    >>> cumulative_product([1, 2, 3, 4])
    [1, 2, 6, 24]
    >>> cumulative_product([2, 0, 5])
    [2, 0, 0]
    """
''',
    '''\
from typing import List


def alternating_sum(numbers: List[int]) -> int:
    """ Add the numbers at even positions and subtract the numbers at odd positions:
    numbers[0] - numbers[1] + numbers[2] - ...
    >>> alternating_sum([10, 3, 5, 1])
    11
    >>> alternating_sum([4])
    4
    >>> alternating_sum([])
    0
    """
''',
    '''\
from typing import List


def find_duplicates(numbers: List[int]) -> List[int]:
    """ Return, in ascending order, every value that appears more than once in the list.
    Each such value is listed only once.
    >>> find_duplicates([4, 3, 2, 7, 8, 2, 3, 1])
    [2, 3]
    >>> find_duplicates([1, 2, 3])
    []
    """
''',
    '''\
from typing import List


def common_elements(first: List[int], second: List[int]) -> List[int]:
    """ Return the sorted list of distinct values that appear in both lists.
    >>> common_elements([1, 2, 2, 5, 9], [2, 9, 9, 4])
    [2, 9]
    >>> common_elements([1, 2], [3, 4])
    []
    """
''',
    '''\
from typing import List


def only_in_one(first: List[int], second: List[int]) -> List[int]:
    """ Return the sorted list of distinct values that appear in exactly one of the two lists.
    >>> only_in_one([1, 2, 3], [2, 3, 4])
    [1, 4]
    >>> only_in_one([5, 5], [5])
    []
    """
''',
    '''\
from typing import List


def top_k_words(words: List[str], k: int) -> List[str]:
    """ Return the k most frequent words, most frequent first.
    Words with the same frequency are ordered alphabetically.
    >>> top_k_words(['a', 'b', 'a', 'c', 'b', 'a'], 2)
    ['a', 'b']
    >>> top_k_words(['pear', 'fig', 'fig', 'pear', 'plum'], 2)
    ['fig', 'pear']
    """
''',
    '''\
from typing import List


def clamp_all(numbers: List[int], low: int, high: int) -> List[int]:
    """ Limit every number to the range from low to high: values below low become low
    and values above high become high.
    >>> clamp_all([-5, 0, 5, 10, 15], 0, 10)
    [0, 0, 5, 10, 10]
    >>> clamp_all([3], 1, 2)
    [2]
    """
''',
    '''\
from typing import List


def normalize(values: List[float]) -> List[float]:
    """ Scale the values linearly so that the smallest becomes 0.0 and the largest becomes 1.0.
    The list has at least two different values.
    >>> normalize([0, 5, 10])
    [0.0, 0.5, 1.0]
    >>> normalize([2, 4, 3, 6])
    [0.0, 0.5, 0.25, 1.0]
    """
''',
    '''\
from typing import List


def product_except_self(numbers: List[int]) -> List[int]:
    """ Return a list where the element at position i is the product of all numbers
    in the input except the one at position i.
    >>> product_except_self([1, 2, 3, 4])
    [24, 12, 8, 6]
    >>> product_except_self([2, 0, 3])
    [0, 6, 0]
    """
''',
    '''\
from typing import List


def count_pairs_with_sum(numbers: List[int], target: int) -> int:
    """ Count the pairs of positions i < j such that numbers[i] + numbers[j] equals the target.
    >>> count_pairs_with_sum([1, 5, 7, -1, 5], 6)
    3
    >>> count_pairs_with_sum([1, 1, 1], 2)
    3
    >>> count_pairs_with_sum([1, 2], 10)
    0
    """
''',
    '''\
from typing import Dict, List


def count_by_first_letter(words: List[str]) -> Dict[str, int]:
    """ Count how many words start with each letter. Letters are compared in lower case
    and the keys are returned in alphabetical order.
    >>> count_by_first_letter(['Apple', 'avocado', 'banana', 'cherry', 'Blueberry'])
    {'a': 2, 'b': 2, 'c': 1}
    >>> count_by_first_letter([])
    {}
    """
''',
    '''\
from typing import Dict


def merge_inventories(first: Dict[str, int], second: Dict[str, int]) -> Dict[str, int]:
    """ Combine two inventories that map item names to quantities. Quantities of items that appear
    in both are added together; keys of the first inventory come first, then new keys of the second.
    >>> merge_inventories({'apple': 3, 'pear': 1}, {'pear': 4, 'plum': 2})
    {'apple': 3, 'pear': 5, 'plum': 2}
    >>> merge_inventories({}, {'fig': 1})
    {'fig': 1}
    """
''',
    '''\
from typing import Dict


def highest_value_key(scores: Dict[str, int]) -> str:
    """ Return the key with the highest value in a non-empty dictionary.
    If several keys share the highest value, return the one that comes first alphabetically.
    >>> highest_value_key({'amy': 82, 'ben': 95, 'cal': 77})
    'ben'
    >>> highest_value_key({'zed': 5, 'abe': 5})
    'abe'
    """
''',
    '''\
def gcd(a: int, b: int) -> int:
    """ Return the greatest common divisor of two non-negative integers using Euclid's algorithm.
    The greatest common divisor of a number and 0 is the number itself.
    >>> gcd(48, 18)
    6
    >>> gcd(17, 5)
    1
    >>> gcd(0, 9)
    9
    """
''',
    '''\
def lcm(a: int, b: int) -> int:
    """ Return the least common multiple of two positive integers, the smallest positive number
    that both of them divide evenly.
    >>> lcm(4, 6)
    12
    >>> lcm(7, 3)
    21
    >>> lcm(5, 5)
    5
    """
''',
    '''\
def factorial(n: int) -> int:
    """ Return n! = 1 * 2 * ... * n for a non-negative integer n. By definition 0! is 1.
    >>> factorial(5)
    120
    >>> factorial(0)
    1
    >>> factorial(10)
    3628800
    """
''',
    '''\
def nth_fibonacci(n: int) -> int:
    """ Return the n-th Fibonacci number, where the sequence starts 0, 1, 1, 2, 3, 5, ...
    and nth_fibonacci(0) is 0.
    >>> nth_fibonacci(0)
    0
    >>> nth_fibonacci(7)
    13
    >>> nth_fibonacci(20)
    6765
    """
''',
    '''\
def digit_sum(number: int) -> int:
    """ Return the sum of the decimal digits of an integer. The sign of negative numbers is ignored.
    >>> digit_sum(1234)
    10
    >>> digit_sum(-907)
    16
    >>> digit_sum(0)
    0
    """
''',
    '''\
def reverse_integer(number: int) -> int:
    """ Reverse the digits of an integer, keeping its sign. Leading zeros of the result are dropped.
    >>> reverse_integer(123)
    321
    >>> reverse_integer(-450)
    -54
    >>> reverse_integer(7)
    7
    """
''',
    '''\
def is_perfect_square(n: int) -> bool:
    """ Return True if n is the square of a whole number. Negative numbers are never perfect squares.
    >>> is_perfect_square(16)
    True
    >>> is_perfect_square(15)
    False
    >>> is_perfect_square(0)
    True
    >>> is_perfect_square(-4)
    False
    """
''',
    '''\
def is_perfect_number(n: int) -> bool:
    """ A perfect number equals the sum of its positive divisors other than itself;
    for example 6 = 1 + 2 + 3. Return True if n is a perfect number.
    >>> is_perfect_number(6)
    True
    >>> is_perfect_number(28)
    True
    >>> is_perfect_number(12)
    False
    """
''',
    '''\
def count_divisors(n: int) -> int:
    """ Return how many positive integers divide n evenly, including 1 and n itself.
    >>> count_divisors(12)
    6
    >>> count_divisors(1)
    1
    >>> count_divisors(25)
    3
    """
''',
    '''\
def collatz_steps(n: int) -> int:
    """ Starting from a positive integer n, repeatedly halve it if it is even, or replace it with
    3 * n + 1 if it is odd. Return the number of steps needed to reach 1.
    >>> collatz_steps(1)
    0
    >>> collatz_steps(6)
    8
    >>> collatz_steps(27)
    111
    """
''',
    '''\
def is_power_of_two(n: int) -> bool:
    """ Return True if n is a power of two (1, 2, 4, 8, ...), and False otherwise.
    >>> is_power_of_two(64)
    True
    >>> is_power_of_two(1)
    True
    >>> is_power_of_two(12)
    False
    >>> is_power_of_two(0)
    False
    """
''',
    '''\
def to_base(number: int, base: int) -> str:
    """ Write a non-negative integer in the given base, between 2 and 16. Digits above 9
    are written as the upper case letters A to F.
    >>> to_base(10, 2)
    '1010'
    >>> to_base(255, 16)
    'FF'
    >>> to_base(0, 8)
    '0'
    """
''',
    '''\
def celsius_to_fahrenheit(celsius: float) -> float:
    """ Convert a temperature from degrees Celsius to degrees Fahrenheit using F = C * 9 / 5 + 32.
    >>> celsius_to_fahrenheit(100)
    212.0
    >>> celsius_to_fahrenheit(-40)
    -40.0
    >>> celsius_to_fahrenheit(37)
    98.6
    """
''',
    '''\
def triangle_type(a: int, b: int, c: int) -> str:
    """ Classify a triangle by the lengths of its sides. Return 'equilateral', 'isosceles' or
    'scalene', or 'invalid' if the three lengths cannot form a triangle.
    >>> triangle_type(3, 3, 3)
    'equilateral'
    >>> triangle_type(3, 4, 4)
    'isosceles'
    >>> triangle_type(3, 4, 5)
    'scalene'
    >>> triangle_type(1, 2, 3)
    'invalid'
    """
''',
    '''\
def days_in_month(month: int, year: int) -> int:
    """ Return the number of days in the given month (1 to 12) of the given year.
    February has 29 days in years divisible by 4, except century years not divisible by 400.
    >>> days_in_month(1, 2023)
    31
    >>> days_in_month(2, 2024)
    29
    >>> days_in_month(2, 1900)
    28
    >>> days_in_month(9, 2021)
    30
    """
''',
    '''\
def digital_root(n: int) -> int:
    """ Repeatedly add up the digits of a non-negative integer until a single digit remains,
    and return that digit.
    >>> digital_root(16)
    7
    >>> digital_root(942)
    6
    >>> digital_root(0)
    0
    """
''',
    '''\
from typing import List


def pascal_row(n: int) -> List[int]:
    """ Return row n of Pascal's triangle, where row 0 is [1]. Each number is the sum of
    the two numbers above it.
    >>> pascal_row(0)
    [1]
    >>> pascal_row(4)
    [1, 4, 6, 4, 1]
    """
''',
    '''\
from typing import List


def fizzbuzz(n: int) -> List[str]:
    """ Return the numbers from 1 to n as strings, but use 'Fizz' for multiples of 3,
    'Buzz' for multiples of 5 and 'FizzBuzz' for multiples of both.
    >>> fizzbuzz(5)
    ['1', '2', 'Fizz', '4', 'Buzz']
    >>> fizzbuzz(15)[-1]
    'FizzBuzz'
    """
''',
    '''\
def climb_stairs(steps: int) -> int:
    """ You can climb a staircase one or two steps at a time. Return the number of different
    ways to reach the top of a staircase with the given number of steps.
    >>> climb_stairs(1)
    1
    >>> climb_stairs(3)
    3
    >>> climb_stairs(5)
    8
    """
''',
    '''\
from typing import List


def coin_change_ways(amount: int, coins: List[int]) -> int:
    """ Count the number of different combinations of coins that add up to the amount.
    Each coin value may be used any number of times, and the order of coins does not matter.
    >>> coin_change_ways(5, [1, 2, 5])
    4
    >>> coin_change_ways(3, [2])
    0
    >>> coin_change_ways(0, [1, 2])
    1
    """
''',
    '''\
def is_happy_number(n: int) -> bool:
    """ Replace a positive integer by the sum of the squares of its digits, again and again.
    The number is happy if this process eventually reaches 1; otherwise it loops forever.
    >>> is_happy_number(19)
    True
    >>> is_happy_number(2)
    False
    >>> is_happy_number(7)
    True
    """
''',
    '''\
def count_set_bits(n: int) -> int:
    """ Return the number of 1 bits in the binary representation of a non-negative integer.
    >>> count_set_bits(7)
    3
    >>> count_set_bits(8)
    1
    >>> count_set_bits(0)
    0
    """
''',
    '''\
from typing import Tuple


def manhattan_distance(p: Tuple[int, int], q: Tuple[int, int]) -> int:
    """ Return the Manhattan distance between two points on a grid: the sum of the absolute
    differences of their x and y coordinates.
    >>> manhattan_distance((1, 2), (4, 6))
    7
    >>> manhattan_distance((0, 0), (-3, 3))
    6
    """
''',
    '''\
def factorial_trailing_zeros(n: int) -> int:
    """ Return how many zeros appear at the end of n! written in decimal, without computing n!.
    >>> factorial_trailing_zeros(5)
    1
    >>> factorial_trailing_zeros(10)
    2
    >>> factorial_trailing_zeros(100)
    24
    """
''',
)

CHAT_QUESTIONS: tuple[str, ...] = (
    "Why does the Moon seem to change shape over the month?",
    "How does a rainbow form?",
    "What is the difference between a comet and an asteroid?",
    "Explain how magnets work in simple terms.",
    "Why do we see lightning before we hear thunder?",
    "What is DNA, and what does it do in our bodies?",
    "What is the difference between a solid, a liquid and a gas?",
    "Explain what an ecosystem is, with one example.",
    "How do fish breathe underwater?",
    "What makes a volcano erupt?",
    "Why is seawater salty when rivers are not?",
    "How does sound travel from a speaker to my ears?",
    "What is the difference between mass and weight?",
    "Why do stars twinkle at night?",
    "Explain natural selection in a few sentences.",
    "How do our eyes tell different colours apart?",
    "What is static electricity, and why does it sometimes give me a small shock?",
    "Why does a metal railing feel colder than a wooden bench on the same day?",
    "What is the difference between an acid and a base?",
    "How do migrating birds find their way?",
    "What is the difference between a planet and a star?",
    "How does a thermometer measure temperature?",
    "What are clouds made of?",
    "Explain what friction is and give two everyday examples.",
    "Why does cutting an onion make people cry?",
    "How do chameleons change colour?",
    "What causes the northern lights?",
    "Describe what happens to food after we swallow it.",
    "Why do some animals hibernate through the winter?",
    "Why does a straw look bent when it stands in a glass of water?",
    "How do antibiotics work, and why should you finish the course?",
    "What happens in the body when you have a fever?",
    "How does a tadpole turn into a frog?",
    "Why are coral reefs important to the ocean?",
    "What is gravity, and why does the Moon not fall onto the Earth?",
    "Explain how a battery stores and releases electricity.",
    "Who built the pyramids of Giza, and why?",
    "What was the Renaissance?",
    "Why did the Western Roman Empire fall?",
    "What was the Industrial Revolution, and why did it matter?",
    "Describe the travels of Marco Polo in a few sentences.",
    "Why is it so easy to float in the Dead Sea?",
    "Name the seven continents and give one fact about each.",
    "What was the Great Wall of China built for?",
    "How did the printing press change the world?",
    "Explain what the Silk Road was.",
    "Why did the Titanic sink?",
    "Why is Canberra the capital of Australia instead of Sydney?",
    "Describe the first Moon landing in 1969.",
    "What were the main causes of the First World War?",
    "Who was Ada Lovelace, and why is she remembered?",
    "Why is the Amazon rainforest so important?",
    "What is life like in the Sahara Desert?",
    "What was the Cold War, in a few sentences?",
    "Why was Venice built on water?",
    "Who were the Vikings?",
    "Tell me briefly about the history of the Olympic Games.",
    "Summarise the life of Marie Curie.",
    "What were some of Leonardo da Vinci's ideas and inventions?",
    "Why did people build castles in the Middle Ages?",
    "What was the Berlin Wall, and why did it come down?",
    "Why is Mount Everest so hard to climb?",
    "What are some simple ways to eat more vegetables?",
    "How can I tell if an egg is still fresh?",
    "What is the difference between baking soda and baking powder?",
    "Suggest a quick dinner I can cook in twenty minutes.",
    "Why is fibre important in our diet, and which foods contain it?",
    "What are the benefits of walking every day?",
    "Give me a simple recipe for pancakes.",
    "How should I store fresh herbs so they last longer?",
    "How do I cook rice on the stove without it sticking?",
    "Why does sugar cause tooth decay?",
    "How should I treat a minor burn at home?",
    "What is the difference between a food allergy and a food intolerance?",
    "How can I handle stress during a busy week?",
    "Why should I wear sunscreen even on cloudy days?",
    "How long should I boil an egg to get a soft, runny yolk?",
    "What is caffeine, and how does it affect the body?",
    "Suggest three vegetarian lunch ideas.",
    "How do I stop cut apples from turning brown?",
    "How can I protect my eyes when I spend all day looking at screens?",
    "Why do we get hiccups, and how can I stop them?",
    "What is the difference between RAM and storage on a computer?",
    "Explain what a password manager does.",
    "How does GPS know where I am?",
    "What is cloud computing?",
    "How can I spot a phishing email?",
    "What does an operating system do?",
    "Explain what an algorithm is, with a simple example.",
    "How does a touchscreen know where I tap?",
    "What is two-factor authentication, and why should I turn it on?",
    "What is the difference between a compiler and an interpreter?",
    "How can I back up the photos on my phone?",
    "Explain what HTML and CSS are used for.",
    "How does a QR code store information?",
    "What is the difference between a for loop and a while loop?",
    "Why does my computer get slower over time, and what can I do about it?",
    "What is a database, and why do websites use them?",
    "How do noise-cancelling headphones work?",
    "Explain what an API is to someone who does not program.",
    "What is version control, and why do programmers use it?",
    "When should I use a dictionary in Python?",
    "How does an electric car work?",
    "What does a recursive function do in programming?",
    "How do I get a coffee stain out of a white shirt?",
    "What is the best way to pack a suitcase so clothes don't get creased?",
    "How do I change a flat tyre on a car?",
    "How should I prepare for a job interview?",
    "How do I clean and look after a cast-iron pan?",
    "How do I start a small vegetable garden?",
    "How can I get better at speaking in front of a group?",
    "How do I write a good cover letter?",
    "What's a good way to organise a messy desk?",
    "How can I unclog a kitchen sink without harsh chemicals?",
    "How do I make friends after moving to a new city?",
    "How do I look after a new puppy in its first week at home?",
    "How can I stay focused when working from home?",
    "How do I read a nutrition label?",
    "I have never run before. How should I start?",
    "How do I wrap a present neatly?",
    "How do I sew a button back onto a shirt?",
    "How can I waste less food at home?",
    "How do I get rid of fruit flies in the kitchen?",
    "How do I plan a surprise birthday party for a friend?",
    "Write a short thank-you note to a teacher.",
    "Write a polite email asking my manager for next Friday off.",
    "Write a short birthday message for my grandmother.",
    "Write a friendly message inviting my neighbours to a barbecue on Saturday.",
    "Write a two-sentence product description for a reusable coffee cup.",
    "Write a short apology to a friend for missing their party.",
    "Write a haiku about the ocean.",
    "Write a short poem about a cat napping in the sun.",
    "Write a polite complaint to a restaurant about a meal that arrived cold.",
    "Write an out-of-office reply for a week of holiday.",
    "Write a short toast for my best friend's wedding.",
    "Write a short social media post announcing the opening of a small flower shop.",
    "Write a message to my landlord about a leaking tap in the bathroom.",
    "Write the opening paragraph of a story about a lighthouse keeper.",
    "Write a limerick about a forgetful dog.",
    "Write a polite follow-up email after a job interview.",
    "Write a note asking a neighbour to water my plants while I am away.",
    "Describe a sunset at the beach in one paragraph.",
    'Rewrite this sentence to sound more formal: "Hey, can you send me that file asap?"',
    "Write an email asking to move my dentist appointment to next week.",
    "How can I stay motivated while studying for exams?",
    "What should I look for when choosing a new laptop?",
    "How should I deal with a coworker who keeps interrupting me?",
    "How can I stop putting things off until the last minute?",
    "What questions should I ask when viewing a flat to rent?",
    "How do I give someone helpful feedback without upsetting them?",
    "I moved to a new town and feel lonely. What can I do?",
    "What should I think about before adopting a pet?",
    "How do I say no to extra work without sounding rude?",
    "How can I build a habit of reading every day?",
    "What should I do to prepare for my first trip abroad?",
    "How do I keep a conversation going with someone I have just met?",
    "What is the difference between a crocodile and an alligator?",
    "What is the difference between a hurricane and a tornado?",
    "What is the difference between a simile and a metaphor?",
    "What is the difference between a latte and a cappuccino?",
    "How is an ape different from a monkey?",
    "Compare LED bulbs with old incandescent bulbs.",
    'When should I use "affect" and when should I use "effect"?',
    "Is a tomato a fruit or a vegetable?",
    "What is the difference between a democracy and a monarchy?",
    "What is the difference between a debit card and a credit card?",
    "What is the difference between a psychologist and a psychiatrist?",
    "What is the difference between a novel and a short story?",
    "What is the difference between baking and roasting?",
    "What is the difference between AC and DC electricity?",
    "In science, what is the difference between a hypothesis and a theory?",
    "How is a sea different from an ocean?",
    "Give three ideas for a fun weekend with friends.",
    "List five houseplants that are easy for beginners.",
    "Give three ideas for a school science fair project.",
    "Suggest five books for someone who loves mystery stories.",
    "List four ways to use less plastic at home.",
    "Suggest a few names for a golden retriever puppy.",
    "Give me five conversation starters for a networking event.",
    "Tell me three fun facts about octopuses.",
    "Give four tips for taking better photos with a phone.",
    "List five things to see on a first visit to Paris.",
    "Suggest three warm-up exercises to do before a run.",
    "Suggest three card games for a family evening.",
    "Give five tips for writing a good essay.",
    "Suggest a simple weekly cleaning routine for a small flat.",
    "Give three ideas for decorating a small bedroom.",
    "Summarise the story of Cinderella in three sentences.",
    "Summarise the plot of Hamlet briefly.",
    "Tell the fable of the tortoise and the hare, and explain its moral.",
    "What happens in Homer's Odyssey, in a few sentences?",
    "Summarise the plot of Pride and Prejudice.",
    "Summarise Alice's Adventures in Wonderland.",
    "What is Mary Shelley's Frankenstein about?",
    "What is George Orwell's Animal Farm about?",
    "Summarise the legend of King Arthur and the sword in the stone.",
    "Summarise A Christmas Carol by Charles Dickens.",
    "Tell the story of the boy who cried wolf and explain what it teaches.",
    "What is the plot of Macbeth?",
    "Explain what a mortgage is.",
    "Explain how the stock market works in simple words.",
    "What are the basic rules of football?",
    "What is a calorie?",
    "Why do people get jet lag after long flights?",
    "What is mindfulness, and how do I practise it?",
    "Why do we have daylight saving time?",
    "Why do cats knock things off tables?",
    "How does a hot air balloon rise?",
    "How does a lock open with the right key?",
    "Why does everyone have different fingerprints?",
    "I have a job interview tomorrow and I feel nervous. What can I do to calm down?",
    "The leaves on my tomato plants are turning yellow. What might be wrong?",
    "I want to start keeping a journal. How should I begin?",
    "My friend just lost their job. What can I say to support them?",
    "I am visiting Japan for the first time next month. Which customs should I know about?",
    "I keep forgetting to water my plants. Do you have any tips?",
    "My Python program keeps raising a KeyError. What does that usually mean?",
    "I'm hosting six people for dinner on Saturday. Can you suggest a simple menu?",
    "My phone battery runs out by the afternoon. How can I make it last longer?",
    "I want to run a 5 km race in two months. Can you give me a simple training plan?",
)
